//! The tokenizer stand-in agrees with the workload crate's token model: a rendered request is
//! as many tokens as the workload says, and a shared first message is a shared cached prefix.

mod support;

use prefix_router_mock_engine::MockEngineConfig;
use prefix_router_workload::{Message, Request, Role, Segment};
use support::*;

fn request(id: u64, messages: Vec<Message>) -> Request {
    Request {
        id,
        arrival_s: 0.0,
        group: None,
        model: None,
        messages,
        output_tokens: 3,
    }
}

#[tokio::test]
async fn workload_bodies_count_and_share_as_the_workload_says() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut config = MockEngineConfig::new(engine(1000)).with_time_scale(0.05);
        // `Request::chat_body` names the model "default" when the workload sets none.
        config.model = "default".into();
        let e = start(config).await;
        let doc = Segment {
            id: 11,
            tokens: 250,
        };
        let a = request(
            0,
            vec![
                Message::new(Role::System, vec![doc]),
                Message::new(Role::User, vec![Segment { id: 12, tokens: 30 }]),
            ],
        );
        let b = request(
            1,
            vec![
                Message::new(Role::System, vec![doc]),
                Message::new(Role::User, vec![Segment { id: 13, tokens: 40 }]),
            ],
        );
        let (s, va) = post_json(
            e.local_addr(),
            "/v1/chat/completions",
            a.chat_body(false, None),
        )
        .await;
        assert_eq!(s, 200, "{va}");
        assert_eq!(va["usage"]["prompt_tokens"], a.prompt_tokens());
        assert_eq!(va["usage"]["completion_tokens"], 3);
        let (_, vb) = post_json(
            e.local_addr(),
            "/v1/chat/completions",
            b.chat_body(false, None),
        )
        .await;
        assert_eq!(vb["usage"]["prompt_tokens"], b.prompt_tokens());
        // The shared 250-token document is 15 full blocks.
        assert_eq!(cached_tokens(&vb), 240);
    })
    .await
    .expect("timed out");
}
