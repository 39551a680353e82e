use std::time::Duration;

use prefix_router_core::StrategyKind;

use super::*;

fn parse(text: &str) -> Result<Settings, SettingsError> {
    settings_from_text(text, std::path::Path::new("test.toml"))
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn example_file_is_valid_and_shows_the_defaults() {
    let text = include_str!("../../../../router.example.toml");
    let s = parse(text).unwrap_or_else(|e| panic!("{e}"));
    let d = parse("").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.listen, d.listen);
    assert_eq!(s.routing.strategy, d.routing.strategy);
    assert_eq!(s.routing.prefix_length, d.routing.prefix_length);
    assert_eq!(s.limits, d.limits);
    assert_eq!(s.timeouts, d.timeouts);
    assert_eq!(s.health, d.health);
    assert_eq!(s.retries.max_retries, d.retries.max_retries);
    assert_eq!(s.kv_events, d.kv_events);
    assert_eq!(s.engine_metrics, d.engine_metrics);
    assert_eq!(s.prewarm, d.prewarm);
    assert_eq!(s.instances.len(), 2);
}

#[test]
fn kv_event_endpoints_are_checked_and_named() {
    let s = parse(
        "[kv_events]\nsubscribe = true\n[[kv_events.endpoints]]\ninstance = \"http://127.0.0.1:8000/\"\npublisher = \"tcp://127.0.0.1:6000\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.kv_events.endpoints[0].instance, "http://127.0.0.1:8000");
    for (text, field) in [
        (
            "[[kv_events.endpoints]]\ninstance = \"http://a:1\"\npublisher = \"udp://a:1\"\n",
            "kv_events.endpoints[0].publisher",
        ),
        (
            "[[kv_events.endpoints]]\ninstance = \"http://a:1\"\npublisher = \"tcp://a:1\"\nreplay = \"tcp://a\"\n",
            "kv_events.endpoints[0].replay",
        ),
        (
            "[[kv_events.endpoints]]\ninstance = \"a:1\"\npublisher = \"tcp://a:1\"\n",
            "kv_events.endpoints[0].instance",
        ),
    ] {
        let e = parse(text).expect_err(text).to_string();
        assert!(e.contains(field), "{e}");
    }
    let e = parse("[kv_events]\nport = 0\n")
        .expect_err("port 0")
        .to_string();
    assert!(e.contains("kv_events.port"), "{e}");
}

#[test]
fn defaults() {
    let s = parse("").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.listen.to_string(), DEFAULT_LISTEN);
    assert!(s.admin.api().is_none());
    assert_eq!(
        s.routing.strategy.kind,
        StrategyKind::named("cache-aware").expect("registered")
    );
    assert_eq!(s.routing.prefix_length.get(), 1024);
    assert_eq!(s.limits.max_body_bytes, 32 * 1024 * 1024);
    assert_eq!(s.timeouts.first_byte, Duration::from_secs(600));
    assert_eq!(s.retries.max_retries, 2);
}

#[test]
fn errors_name_the_field() {
    assert!(err("[routing]\nprefix_length = 12").contains("routing.prefix_length"));
    assert!(err("[routing]\nconcurrency_threshold = 0").contains("routing.concurrency_threshold"));
    assert!(err("[routing]\nconcurrency_threshold = 1025").contains("1..=1024"));
    assert!(err("[routing]\nstrategy = \"fastest\"").contains("routing.strategy"));
    assert!(
        err("[routing]\nstrategy = \"prefix-aware\"\nbalance_factor = 0.5")
            .contains("routing.balance_factor")
    );
    assert!(err("listen = \"nowhere\"").contains("`listen`"));
    assert!(err("[prewarm]\nmax_bytes = 0").contains("prewarm.max_bytes"));
    assert!(err("[admin]\nlisten = \"127.0.0.1:1\"").contains("admin.token"));
    assert!(err("[admin]\ntoken = \"two words\"").contains("admin.token"));
    assert!(err("[admin]\ntoken = \" \\n\"").contains("must not be empty"));
    let t = parse("[admin]\nlisten = \"127.0.0.1:1\"\ntoken = \"s3cret\\n\"")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.admin.token.as_deref(), Some("s3cret"));
    assert!(err("[timeouts]\nconnect_ms = 0").contains("timeouts.connect_ms"));
    assert!(err("[[discovery.dns]]\nname = \"\"\nport = 80").contains("discovery.dns[0].name"));
    assert!(err("[[discovery.dns]]\nname = \"svc\"\nport = 0").contains("discovery.dns[0].port"));
    let dns = |rest: &str| err(&format!("[[discovery.dns]]\nname = \"svc\"\n{rest}"));
    assert!(dns("").contains("discovery.dns[0].port"));
    assert!(dns("record = \"srv\"\nport = 80").contains("leave port out"));
    assert!(dns("record = \"mx\"\nport = 80").contains("discovery.dns[0].record"));
    assert!(dns("port = 80\nserver = \"dns.local\"").contains("discovery.dns[0].server"));
    let srv = parse("[[discovery.dns]]\nname = \"_http._tcp.svc\"\nrecord = \"srv\"\nserver = \"127.0.0.1:8600\"")
        .unwrap_or_else(|e| panic!("{e}"));
    let t = &srv.discovery.dns[0];
    assert_eq!(
        (t.record, t.port, t.server),
        (DnsRecord::Srv, 0, "127.0.0.1:8600".parse().ok())
    );
    assert!(err("[discovery]\nmodels = true\nmodels_interval_ms = 0")
        .contains("discovery.models_interval_ms"));
    let k8s = |rest: &str| err(&format!("[discovery.kubernetes]\n{rest}"));
    assert!(k8s("port = \"http\"").contains("service"));
    assert!(
        k8s("service = \"vLLM_pool\"\nport = \"http\"").contains("discovery.kubernetes.service")
    );
    assert!(k8s("service = \"vllm\"\nport = 8000").contains("discovery.kubernetes.port"));
    assert!(k8s("service = \"vllm\"\nport = \"8000 \"").contains("not its number"));
    assert!(
        k8s("service = \"vllm\"\nport = \"http\"\nscheme = \"grpc\"")
            .contains("discovery.kubernetes.scheme")
    );
    assert!(
        k8s("service = \"vllm\"\nport = \"http\"\napi_server = \"localhost\"")
            .contains("discovery.kubernetes.api_server")
    );
    let k = parse(
        "[discovery.kubernetes]\nservice = \"vllm\"\nport = \"http\"\nfirst_list_timeout_ms = 500",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let k = k.discovery.kubernetes.unwrap_or_else(|| panic!("parsed"));
    assert_eq!(
        (
            k.scheme.as_str(),
            k.namespace,
            k.first_list_timeout.as_millis(),
            k.unready_keep.as_millis()
        ),
        ("http", None, 500, 60_000)
    );
    let k =
        parse("[discovery.kubernetes]\nservice = \"vllm\"\nport = \"http\"\nunready_keep_ms = 0")
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        k.discovery.kubernetes.map(|k| k.unready_keep.as_millis()),
        Some(0)
    );
    let dup =
        "[[instances]]\nurl = \"http://127.0.0.1:1\"\n[[instances]]\nurl = \"http://127.0.0.1:1/\"";
    let e = err(dup);
    assert!(
        e.contains("instances[1].url") && e.contains("duplicate"),
        "{e}"
    );
    assert!(err("[[instances]]\nurl = \"ftp://x:1\"").contains("scheme"));
    assert!(err("[[instances]]\nurl = \"http://x:1/v1\"").contains("without path"));
    assert!(err("[[instances]]\nurl = \"not a url\"").contains("instances[0].url"));
    assert!(err("[[instances]]\nurl = \"http://x:1\"\nweight = 0").contains("instances[0].weight"));
    for e in [
        err("[routing]\nprefix_length = 12"),
        err("[[instances]]\nurl = \"x\""),
    ] {
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn file_errors_are_one_line_with_the_line_number() {
    let dir = std::env::temp_dir().join(format!("pr-settings-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:1\"\n[routing]\nprefix_lenght = 2048\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let src = ConfigSource {
        path: Some(path.clone()),
        overrides: Overrides::default(),
    };
    let e = src.load().map(|_| ()).map_err(|e| e.to_string());
    let e = e.err().unwrap_or_default();
    assert!(e.contains("line 3") && e.contains("prefix_lenght"), "{e}");
    assert!(!e.contains('\n'));
    let missing = ConfigSource {
        path: Some(dir.join("absent.toml")),
        overrides: Overrides::default(),
    };
    assert!(matches!(missing.load(), Err(SettingsError::Read { .. })));
    let _ = std::fs::remove_file(path);
}

#[test]
fn overrides_win_over_the_file() {
    let dir = std::env::temp_dir().join(format!("pr-settings-o-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("ok.toml");
    std::fs::write(
        &path,
        "[routing]\nprefix_length = 2048\nconcurrency_threshold = 4\n[[instances]]\nurl = \"http://127.0.0.1:9\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut src = ConfigSource {
        path: Some(path.clone()),
        overrides: Overrides::default(),
    };
    let s = src.load().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.routing.prefix_length.get(), 2048);
    assert_eq!(s.instances.len(), 1);
    src.overrides = Overrides {
        instances: vec!["http://127.0.0.1:10".into(), "http://127.0.0.1:11".into()],
        concurrency_threshold: Some(8),
        strategy: Some("round-robin".into()),
        ..Overrides::default()
    };
    let s = src.load().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.instances.len(), 2);
    assert_eq!(s.routing.strategy.concurrency_threshold.get(), 8);
    assert_eq!(
        s.routing.strategy.kind,
        StrategyKind::named("round-robin").expect("registered")
    );
    assert_eq!(s.routing.prefix_length.get(), 2048);
    let _ = std::fs::remove_file(path);
}

#[test]
fn strategy_parameters_from_the_file_and_the_flags() {
    let s = parse("[routing]\nstrategy = \"cache-aware\"\n[routing.params]\nindex-blocks = 4096\ntie-tolerance = 0.25\nblock-chars = \"64\"\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let p = &s.routing.strategy.params;
    assert_eq!(p.get("index-blocks").map(String::as_str), Some("4096"));
    assert_eq!(p.get("tie-tolerance").map(String::as_str), Some("0.25"));
    assert_eq!(p.get("block-chars").map(String::as_str), Some("64"));

    let dir = std::env::temp_dir().join(format!("pr-settings-p-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("params.toml");
    std::fs::write(
        &path,
        "[routing]\nstrategy = \"cache-aware\"\n[routing.params]\nindex-blocks = 4096\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut src = ConfigSource {
        path: Some(path.clone()),
        overrides: Overrides {
            strategy_params: vec!["index-blocks = 8192".into(), "cache-chars=100000".into()],
            ..Overrides::default()
        },
    };
    let s = src.load().unwrap_or_else(|e| panic!("{e}"));
    let p = &s.routing.strategy.params;
    assert_eq!(p.get("index-blocks").map(String::as_str), Some("8192"));
    assert_eq!(p.get("cache-chars").map(String::as_str), Some("100000"));
    src.overrides.strategy_params = vec!["index-blocks".into()];
    let e = src.load().map(|_| ()).map_err(|e| e.to_string());
    assert!(
        matches!(&e, Err(m) if m.contains("--strategy-param") && m.contains("NAME=VALUE")),
        "{e:?}"
    );
    // Another strategy by flag: the file's cache-aware parameters are not its own.
    src.overrides.strategy_params.clear();
    src.overrides.strategy = Some("least-outstanding".into());
    let s = src.load().unwrap_or_else(|e| panic!("{e}"));
    assert!(s.routing.strategy.params.is_empty());
    // The same strategy by flag keeps them.
    src.overrides.strategy = Some("cache-aware".into());
    let s = src.load().unwrap_or_else(|e| panic!("{e}"));
    let p = &s.routing.strategy.params;
    assert_eq!(p.get("index-blocks").map(String::as_str), Some("4096"));
    let _ = std::fs::remove_file(path);
}

#[test]
fn strategy_parameter_errors_name_the_parameter() {
    for (text, field) in [
        (
            "[routing]\nstrategy = \"cache-aware\"\n[routing.params]\nindex-blocks = \"lots\"",
            "routing.params.index-blocks",
        ),
        (
            "[routing]\nstrategy = \"cache-aware\"\n[routing.params]\nnope = 1",
            "routing.params.nope",
        ),
        (
            "[routing]\nstrategy = \"prefix-aware\"\n[routing.params]\nindex-blocks = 1",
            "routing.params.index-blocks",
        ),
        (
            "[routing]\nstrategy = \"cache-aware\"\n[routing.params]\nindex-blocks = true",
            "routing.params.index-blocks",
        ),
        (
            "[routing]\nstrategy = \"cache-aware\"\n[routing.params]\nblock-chars = [1]",
            "routing.params.block-chars",
        ),
    ] {
        let e = err(text);
        assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
    let e = err("[routing]\nstrategy = \"nope\"");
    assert!(
        e.contains("routing.strategy") && e.contains("cache-aware"),
        "{e}"
    );
}

#[test]
fn a_staleness_bound_shorter_than_the_scrape_interval_is_refused() {
    let e = err("[engine_metrics]\nscrape = true\ninterval_ms = 2000\nstale_after_ms = 1000");
    assert!(e.contains("engine_metrics.stale_after_ms"), "{e}");
    assert!(err("[engine_metrics]\nstale_after_ms = 0").contains("stale_after_ms"));
}

#[test]
fn a_tokenizer_per_model_parses_and_each_model_has_one() {
    let s = parse(
        "[kv_events]\ntokenizer = \"builtin:words\"\n[[kv_events.tokenizers]]\nmodel = \"model-a\"\ntokenizer = \"/models/a/tokenizer.json\"\nchat_template = \"/models/a/template.jinja\"\n[[kv_events.tokenizers]]\nmodel = \"model-b\"\ntokenizer = \"builtin:words\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let k = &s.kv_events;
    assert_eq!(
        k.tokenizer.as_deref(),
        Some(std::path::Path::new("builtin:words"))
    );
    assert_eq!(
        k.tokenizers,
        vec![
            KvEventsTokenizer {
                model: "model-a".into(),
                tokenizer: "/models/a/tokenizer.json".into(),
                chat_template: Some("/models/a/template.jinja".into()),
            },
            KvEventsTokenizer {
                model: "model-b".into(),
                tokenizer: "builtin:words".into(),
                chat_template: None,
            },
        ]
    );
    let entry = |model: &str| {
        format!("[[kv_events.tokenizers]]\nmodel = \"{model}\"\ntokenizer = \"builtin:words\"\n")
    };
    let e = err(&format!(
        "{}{}{}",
        entry("model-a"),
        entry("model-b"),
        entry("model-a")
    ));
    assert!(
        e.contains("kv_events.tokenizers[2].model") && e.contains("'model-a'"),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    let e = err(&entry(" "));
    assert!(e.contains("kv_events.tokenizers[0].model"), "{e}");
}

#[test]
fn a_tokenizer_entry_needs_its_fields_and_no_others() {
    // Placed at the entry's header.
    let e = err("[kv_events]\nsubscribe = true\n[[kv_events.tokenizers]]\nmodel = \"model-a\"\n");
    assert!(
        e.contains("line 3") && e.contains("missing field `tokenizer`"),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    let e = err("[[kv_events.tokenizers]]\ntokenizer = \"builtin:words\"\n");
    assert!(e.contains("missing field `model`"), "{e}");
    let e = err("[[kv_events.tokenizers]]\nmodel = \"m\"\ntokenizer = \"builtin:words\"\ntemplate = \"x\"\n");
    assert!(e.contains("template"), "{e}");
    let e = err("[[kv_events.tokenizers]]\nmodel = \"m\"\ntokenizer = \"\"\n");
    assert!(e.contains("kv_events.tokenizers[0].tokenizer"), "{e}");
}
