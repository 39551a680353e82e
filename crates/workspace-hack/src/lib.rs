//! Empty on purpose: this crate only adds dependency features (see its Cargo.toml), so that the
//! release binary and the release test builds compile each dependency once, with one feature set.
