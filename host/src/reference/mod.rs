//! reference (to be written).
