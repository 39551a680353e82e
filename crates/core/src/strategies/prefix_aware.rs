//! Strategy prefix_aware.
