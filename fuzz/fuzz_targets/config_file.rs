//! `serve --config` on arbitrary file contents: parsing and validation never panic, and a file
//! that is accepted validates to settings that rebuild the same strategy (no field is accepted
//! on one pass and refused on another).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_server::settings::settings_from_text;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("fuzz.toml");
    match settings_from_text(text, path) {
        Ok(settings) => {
            assert!(
                settings.routing.strategy.build().is_ok(),
                "accepted, then unbuildable"
            );
            let again = settings_from_text(text, path).expect("accepted once, refused again");
            assert_eq!(again.routing.strategy, settings.routing.strategy);
        }
        Err(e) => {
            // Every refusal is one line that names where.
            let line = e.to_string();
            assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
        }
    }
});
