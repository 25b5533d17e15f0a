//! trace (to be written).
