//! Prints every engine preset's summary: `cargo run -p prefix-router-engine-model --example presets`.

fn main() {
    for p in prefix_router_engine_model::PRESETS {
        println!("{}\n", p.summary());
    }
}
