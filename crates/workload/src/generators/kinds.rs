//! Session sources of the built-in workloads: what one conversation, document query, agent run
//! or retrieval looks like. Every segment id is chained from its predecessor (or from a root
//! that fixes everything before it), which keeps ids prefix-chained.

use super::distributions::{exponential, geometric, geometric_mean, ZipfRanks};
use super::schedule::{Session, SessionSource, Turn};
use super::{
    AgentParams, HotPrefixParams, LongContextParams, RagParams, SharedSystemPromptParams,
    SharegptParams,
};
use crate::ids::generator_id;
use crate::request::{Message, Role, Segment};
use rand::Rng;
use rand_pcg::Pcg64Mcg;
use std::collections::VecDeque;

/// Salt of per-request unique segments (questions, suffixes): above every entity index salt.
const UNIQUE_SALT: u64 = 1 << 63;

fn seg(id: u64, tokens: u32) -> Segment {
    Segment { id, tokens }
}

fn msg(role: Role, segments: Vec<Segment>) -> Message {
    Message::new(
        role,
        segments.into_iter().filter(|s| s.tokens > 0).collect(),
    )
}

fn single(
    prefix: Vec<Message>,
    new_messages: Vec<Message>,
    output: u32,
    group: Option<String>,
) -> Session {
    Session {
        prefix,
        turns: VecDeque::from([Turn {
            new_messages,
            output_tokens: output.max(1),
            gap_s: 0.0,
        }]),
        group,
    }
}

/// Names the routing group of an entity (document, prefix, conversation) when groups are on:
/// `tenant-<k>` with k a stable hash of the entity modulo `groups`.
pub(crate) struct Groups {
    root: u64,
    groups: Option<u32>,
}

impl Groups {
    pub(crate) fn new(root: u64, groups: Option<u32>) -> Self {
        Groups {
            root,
            groups: groups.filter(|&g| g > 0),
        }
    }
    pub(crate) fn of(&self, entity: u64) -> Option<String> {
        self.index(entity).map(|k| format!("tenant-{k}"))
    }
    /// The `k` of [`Groups::of`].
    pub(crate) fn index(&self, entity: u64) -> Option<u64> {
        self.groups
            .map(|g| generator_id(self.root, entity) % u64::from(g))
    }
}

/// A user message holding document `doc_id` and request `index`'s unique question after it.
fn document_question(doc_id: u64, doc_tokens: u32, question: u32, index: u64) -> Message {
    msg(
        Role::User,
        vec![
            seg(doc_id, doc_tokens),
            seg(generator_id(doc_id, UNIQUE_SALT | index), question),
        ],
    )
}

pub(crate) struct LongContext {
    pub p: LongContextParams,
    pub docs_root: u64,
    pub groups: Groups,
}

impl SessionSource for LongContext {
    fn next_session(&mut self, rng: &mut Pcg64Mcg, index: u64) -> Option<Session> {
        let doc = rng.gen_range(0..self.p.documents.max(1));
        let doc_id = generator_id(self.docs_root, u64::from(doc));
        let question = self.p.question_tokens.sample(rng);
        let output = self.p.output_tokens.sample(rng);
        let user = document_question(doc_id, self.p.doc_tokens, question, index);
        Some(single(
            Vec::new(),
            vec![user],
            output,
            self.groups.of(u64::from(doc)),
        ))
    }
    fn mean_turns(&self) -> f64 {
        1.0
    }
}

/// One system prompt (per tenant with groups, else one for all), then a document and a question.
/// The document's id is chained from the system prompt's, so the same document behind two
/// tenants' prompts is two different prefixes (as it is to an engine's cache).
pub(crate) struct SharedSystemPrompt {
    pub p: SharedSystemPromptParams,
    pub root: u64,
    pub groups: Groups,
}

impl SessionSource for SharedSystemPrompt {
    fn next_session(&mut self, rng: &mut Pcg64Mcg, index: u64) -> Option<Session> {
        let doc = rng.gen_range(0..self.p.documents.max(1));
        let question = self.p.question_tokens.sample(rng);
        let output = self.p.output_tokens.sample(rng);
        let tenant = self.groups.index(u64::from(doc));
        let system_id = generator_id(generator_id(self.root, 0), tenant.unwrap_or(0));
        let doc_id = generator_id(system_id, 1 + u64::from(doc));
        let system = msg(Role::System, vec![seg(system_id, self.p.system_tokens)]);
        let user = document_question(doc_id, self.p.doc_tokens, question, index);
        Some(single(
            vec![system],
            vec![user],
            output,
            self.groups.of(u64::from(doc)),
        ))
    }
    fn mean_turns(&self) -> f64 {
        1.0
    }
}

pub(crate) struct Sharegpt {
    pub p: SharegptParams,
    pub root: u64,
    pub groups: Groups,
}

impl SessionSource for Sharegpt {
    fn next_session(&mut self, rng: &mut Pcg64Mcg, index: u64) -> Option<Session> {
        let p = &self.p;
        let mut prefix = Vec::new();
        let share = if p.system_prompt_share.is_finite() {
            p.system_prompt_share.clamp(0.0, 1.0)
        } else {
            0.0
        };
        if p.system_prompts > 0 && p.system_prompt_tokens > 0 && rng.gen_bool(share) {
            let which = rng.gen_range(0..p.system_prompts);
            let id = generator_id(generator_id(self.root, 0), u64::from(which));
            prefix.push(msg(Role::System, vec![seg(id, p.system_prompt_tokens)]));
        }
        // The conversation root fixes the (optional) system prompt, so chaining every message
        // from it by position keeps ids prefix-chained.
        let conv = generator_id(generator_id(self.root, 1), index);
        let turns = geometric(rng, p.mean_turns, p.max_turns);
        let mut script = VecDeque::with_capacity(turns as usize);
        let mut previous_answer: Option<(u64, u32)> = None;
        for t in 0..u64::from(turns) {
            let user = p.user_tokens.sample(rng);
            let answer = p.assistant_tokens.sample(rng).max(1);
            let user_msg = msg(Role::User, vec![seg(generator_id(conv, 2 * t), user)]);
            let (new_messages, gap_s) = match previous_answer {
                None => (vec![user_msg], 0.0),
                Some((id, tokens)) => (
                    vec![msg(Role::Assistant, vec![seg(id, tokens)]), user_msg],
                    f64::from(tokens) * p.decode_s_per_token.max(0.0)
                        + exponential(rng, p.think_time_s),
                ),
            };
            script.push_back(Turn {
                new_messages,
                output_tokens: answer,
                gap_s,
            });
            previous_answer = Some((generator_id(conv, 2 * t + 1), answer));
        }
        Some(Session {
            prefix,
            turns: script,
            group: self.groups.of(index),
        })
    }
    fn mean_turns(&self) -> f64 {
        geometric_mean(self.p.mean_turns, self.p.max_turns)
    }
}

pub(crate) struct Rag {
    pub p: RagParams,
    pub root: u64,
    pub zipf: ZipfRanks,
    pub groups: Groups,
}

impl SessionSource for Rag {
    fn next_session(&mut self, rng: &mut Pcg64Mcg, index: u64) -> Option<Session> {
        let p = &self.p;
        let system_id = generator_id(self.root, 0);
        let system = msg(Role::System, vec![seg(system_id, p.system_prompt_tokens)]);
        let k = p.chunks_per_request.min(p.corpus_chunks.max(1)) as usize;
        let mut chosen: Vec<u64> = Vec::with_capacity(k);
        // Distinct chunks in retrieval (draw) order; bounded tries so a tiny corpus cannot loop.
        let mut tries = 0;
        while chosen.len() < k && tries < 64 * k + 64 {
            tries += 1;
            let c = self.zipf.sample(rng);
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        let mut parent = system_id;
        let mut segments = Vec::with_capacity(chosen.len() + 1);
        for c in chosen {
            parent = generator_id(parent, c);
            segments.push(seg(parent, p.chunk_tokens));
        }
        let question = p.question_tokens.sample(rng);
        segments.push(seg(generator_id(parent, UNIQUE_SALT | index), question));
        let output = p.output_tokens.sample(rng);
        Some(single(
            vec![system],
            vec![msg(Role::User, segments)],
            output,
            self.groups.of(index),
        ))
    }
    fn mean_turns(&self) -> f64 {
        1.0
    }
}

pub(crate) struct Agent {
    pub p: AgentParams,
    pub root: u64,
    pub groups: Groups,
}

impl SessionSource for Agent {
    fn next_session(&mut self, rng: &mut Pcg64Mcg, index: u64) -> Option<Session> {
        let p = &self.p;
        let kind = rng.gen_range(0..p.agent_types.max(1));
        let instructions = generator_id(generator_id(self.root, 0), u64::from(kind));
        let prefix = vec![msg(
            Role::System,
            vec![seg(instructions, p.instructions_tokens)],
        )];
        // The session root fixes the agent type (hence the instructions) before it.
        let session = generator_id(generator_id(self.root, 1), index);
        let steps = geometric(rng, p.mean_steps, p.max_steps);
        let task = msg(
            Role::User,
            vec![seg(generator_id(session, 0), p.task_tokens.sample(rng))],
        );
        let mut script = VecDeque::with_capacity(steps as usize);
        let mut previous: Option<(u64, u32)> = None;
        for s in 0..u64::from(steps) {
            let action = p.action_tokens.sample(rng).max(1);
            let (new_messages, gap_s) = match previous {
                None => (vec![task.clone()], 0.0),
                Some((action_id, action_tokens)) => {
                    let result = p.tool_result_tokens.sample(rng);
                    let result_id = generator_id(session, 3 * s + 2);
                    (
                        vec![
                            msg(Role::Assistant, vec![seg(action_id, action_tokens)]),
                            msg(Role::User, vec![seg(result_id, result)]),
                        ],
                        f64::from(action_tokens) * p.decode_s_per_token.max(0.0)
                            + exponential(rng, p.tool_time_s),
                    )
                }
            };
            script.push_back(Turn {
                new_messages,
                output_tokens: action,
                gap_s,
            });
            previous = Some((generator_id(session, 3 * s + 1), action));
        }
        Some(Session {
            prefix,
            turns: script,
            group: self.groups.of(index),
        })
    }
    fn mean_turns(&self) -> f64 {
        geometric_mean(self.p.mean_steps, self.p.max_steps)
    }
}

pub(crate) struct HotPrefix {
    pub p: HotPrefixParams,
    pub root: u64,
    pub groups: Groups,
}

impl SessionSource for HotPrefix {
    fn next_session(&mut self, rng: &mut Pcg64Mcg, index: u64) -> Option<Session> {
        let p = &self.p;
        let share = if p.hot_share.is_finite() {
            p.hot_share.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let prefix_index = if p.tail_prefixes == 0 || rng.gen_bool(share) {
            0
        } else {
            1 + u64::from(rng.gen_range(0..p.tail_prefixes))
        };
        let prefix_id = generator_id(self.root, prefix_index);
        let system = msg(Role::System, vec![seg(prefix_id, p.prefix_tokens)]);
        let suffix = p.suffix_tokens.sample(rng);
        let user = msg(
            Role::User,
            vec![seg(generator_id(prefix_id, UNIQUE_SALT | index), suffix)],
        );
        let output = p.output_tokens.sample(rng);
        Some(single(
            vec![system],
            vec![user],
            output,
            self.groups.of(prefix_index),
        ))
    }
    fn mean_turns(&self) -> f64 {
        1.0
    }
}
