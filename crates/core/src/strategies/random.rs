//! Strategy random.
