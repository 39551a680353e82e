//! Strategy least_outstanding.
