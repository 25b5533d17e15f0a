//! analysis (to be written).
