//! Token ids the way an engine computes them, so that the router's blocks of a request are the
//! engine's blocks: a Hugging Face `tokenizer.json` (read from a local file with the
//! `tokenizers` crate; never downloaded) and the model's chat template (Jinja, rendered with
//! minijinja as vLLM renders it through transformers: `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, `raise_exception`, `strftime_now`). A chat request is rendered,
//! then encoded without adding special tokens (the template writes them); a completion prompt
//! is encoded with them.

mod body;
mod strftime;
pub mod words;

use std::path::Path;

pub use body::Prompt;

use serde::Deserialize;

/// Why a tokenizer could not be loaded or a prompt not be tokenized.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} is not a tokenizer: {message}")]
    Tokenizer { path: String, message: String },
    #[error("{path}: {message}")]
    Config { path: String, message: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("no chat template: give one in tokenizer_config.json or as a template file")]
    NoTemplate,
    #[error("cannot encode the prompt: {0}")]
    Encode(String),
}

/// The tokenizer setting that names [`ChatTokenizer::words`].
pub const WORDS: &str = "builtin:words";

/// One chat message, as the template sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message<'a> {
    pub role: &'a str,
    pub content: &'a str,
}

/// A tokenizer and the chat template that goes with it.
pub struct ChatTokenizer {
    kind: Kind,
}

/// A model's tokenizer.json and chat template.
struct Model {
    tokenizer: tokenizers::Tokenizer,
    env: Option<minijinja::Environment<'static>>,
    bos: String,
    eos: String,
}

enum Kind {
    Model(Box<Model>),
    /// The mock engine's text model ([`words`]).
    Words,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Model(m) => f
                .debug_struct("ChatTokenizer")
                .field("vocab", &m.tokenizer.get_vocab_size(true))
                .field("template", &m.env.is_some())
                .finish(),
            Kind::Words => f.write_str("ChatTokenizer(words)"),
        }
    }
}

/// `bos_token` / `eos_token` in `tokenizer_config.json`: a string or `{"content": ...}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SpecialToken {
    Text(String),
    Added { content: String },
}

/// `chat_template`: one string, or named templates (`default` is used).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Template {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Debug, Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    bos_token: Option<SpecialToken>,
    #[serde(default)]
    eos_token: Option<SpecialToken>,
    #[serde(default)]
    chat_template: Option<Template>,
}

fn text(t: Option<SpecialToken>) -> String {
    match t {
        Some(SpecialToken::Text(s)) | Some(SpecialToken::Added { content: s }) => s,
        None => String::new(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TokenizeError> {
    std::fs::read(path).map_err(|e| TokenizeError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

impl ChatTokenizer {
    /// From a `tokenizer.json`'s bytes, with a chat template (none: chat requests cannot be
    /// tokenized) and the texts of the BOS and EOS tokens the template may use.
    pub fn from_json(
        json: &[u8],
        template: Option<String>,
        bos: &str,
        eos: &str,
    ) -> Result<Self, TokenizeError> {
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(json).map_err(|e| TokenizeError::Tokenizer {
                path: "tokenizer.json".into(),
                message: e.to_string(),
            })?;
        let env = template.map(environment).transpose()?;
        Ok(Self {
            kind: Kind::Model(Box::new(Model {
                tokenizer,
                env,
                bos: bos.into(),
                eos: eos.into(),
            })),
        })
    }

    /// One token per whitespace-separated word, as prefix-router's mock engine counts them
    /// ([`words`]): for replaying generated workloads against mock engines that publish KV
    /// events without a model tokenizer. Roles and templates add no tokens.
    pub fn words() -> Self {
        Self { kind: Kind::Words }
    }

    /// A tokenizer named in a configuration: [`WORDS`] for [`Self::words`], else a
    /// `tokenizer.json` path (see [`Self::from_dir_files`]).
    pub fn from_setting(tokenizer: &Path, template: Option<String>) -> Result<Self, TokenizeError> {
        if tokenizer.as_os_str() == WORDS {
            return Ok(Self::words());
        }
        Self::from_dir_files(tokenizer, template)
    }

    /// From a model's files: `tokenizer.json`, and `tokenizer_config.json` beside it when
    /// present (its chat template and BOS/EOS texts). `template` (a file's text) replaces the
    /// config's template.
    pub fn from_dir_files(
        tokenizer: &Path,
        template: Option<String>,
    ) -> Result<Self, TokenizeError> {
        let json = read(tokenizer)?;
        let config_path = tokenizer.with_file_name("tokenizer_config.json");
        let config = if config_path.exists() {
            let bytes = read(&config_path)?;
            serde_json::from_slice::<TokenizerConfig>(&bytes).map_err(|e| {
                TokenizeError::Config {
                    path: config_path.display().to_string(),
                    message: e.to_string(),
                }
            })?
        } else {
            TokenizerConfig {
                bos_token: None,
                eos_token: None,
                chat_template: None,
            }
        };
        let from_config = match config.chat_template {
            Some(Template::One(t)) => Some(t),
            Some(Template::Named(list)) => list
                .into_iter()
                .find(|t| t.name == "default")
                .map(|t| t.template),
            None => None,
        };
        Self::from_json(
            &json,
            template.or(from_config),
            &text(config.bos_token),
            &text(config.eos_token),
        )
        .map_err(|e| match e {
            TokenizeError::Tokenizer { message, .. } => TokenizeError::Tokenizer {
                path: tokenizer.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Whether chat requests can be tokenized (a template is loaded, or none is needed).
    pub fn has_template(&self) -> bool {
        match &self.kind {
            Kind::Model(m) => m.env.is_some(),
            Kind::Words => true,
        }
    }

    /// The prompt text the template makes of `messages`, ready for the assistant's answer
    /// (the contents one after another for [`Self::words`]).
    pub fn render_chat(&self, messages: &[Message<'_>]) -> Result<String, TokenizeError> {
        let (env, bos, eos) = match &self.kind {
            Kind::Model(m) => (&m.env, &m.bos, &m.eos),
            Kind::Words => {
                let texts: Vec<&str> = messages.iter().map(|m| m.content).collect();
                return Ok(texts.join(" "));
            }
        };
        let env = env.as_ref().ok_or(TokenizeError::NoTemplate)?;
        let template = env
            .get_template("chat")
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => bos,
                eos_token => eos,
            })
            .map_err(|e| TokenizeError::Template(e.to_string()))
    }

    /// The token ids of a chat request.
    pub fn chat_ids(&self, messages: &[Message<'_>]) -> Result<Vec<u32>, TokenizeError> {
        let prompt = self.render_chat(messages)?;
        self.encode(&prompt, false)
    }

    /// The token ids of a completion prompt (special tokens added as the tokenizer defines).
    pub fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>, TokenizeError> {
        self.encode(prompt, true)
    }

    fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, TokenizeError> {
        match &self.kind {
            Kind::Model(m) => m
                .tokenizer
                .encode_fast(text, special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizeError::Encode(e.to_string())),
            Kind::Words => Ok(words::ids(text)),
        }
    }
}

fn environment(template: String) -> Result<minijinja::Environment<'static>, TokenizeError> {
    let mut env = minijinja::Environment::new();
    // As transformers renders chat templates: a block tag's own line break and leading
    // indentation are not output (multi-line templates depend on it), and Python's string
    // methods work.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    // Templates stop a request they cannot render this way (transformers' own helper).
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    // transformers defines it for templates, and vLLM renders through transformers.
    env.add_function("strftime_now", |format: String| strftime::now(&format));
    env.add_template_owned("chat", template)
        .map_err(|e| TokenizeError::Template(e.to_string()))?;
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours() -> ChatTokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tokenizers/byte-bpe");
        ChatTokenizer::from_dir_files(&dir.join("tokenizer.json"), None).expect("loads")
    }

    #[test]
    fn strftime_now_is_defined_as_transformers_defines_it() {
        // Llama 3.2's header: today's date where transformers (and so vLLM) renders it.
        let env = environment(
            r#"{%- if strftime_now is defined %}{{ strftime_now("%d %b %Y") }}{%- else %}26 Jul 2024{%- endif %}"#
                .into(),
        )
        .expect("template");
        let out = env
            .get_template("chat")
            .and_then(|t| t.render(minijinja::context! {}))
            .expect("renders");
        assert_eq!(out, strftime::now("%d %b %Y"));
        assert_ne!(out, "26 Jul 2024");
    }

    #[test]
    fn renders_the_template_and_encodes_it_without_adding_specials() {
        let t = ours();
        let m = [
            Message {
                role: "system",
                content: "Summarize the lease. ",
            },
            Message {
                role: "user",
                content: "the tenant",
            },
        ];
        let prompt = t.render_chat(&m).expect("renders");
        assert_eq!(
            prompt,
            "<s><|system|>\nSummarize the lease.</s>\n<|user|>\nthe tenant</s>\n<|assistant|>\n"
        );
        let ids = t.chat_ids(&m).expect("encodes");
        // <s> is written by the template and encoded as the special token, once.
        assert_eq!(ids[0], 0);
        assert_eq!(ids.iter().filter(|&&i| i == 0).count(), 1);
        // Merges make tokens longer than bytes.
        assert!(
            ids.len() < prompt.len() * 3 / 4,
            "{} ids for {} bytes",
            ids.len(),
            prompt.len()
        );
        // A longer conversation starts with the same tokens (what prefix caching needs).
        let mut more = m.to_vec();
        more.push(Message {
            role: "assistant",
            content: "ok",
        });
        let longer = t.chat_ids(&more).expect("encodes");
        let common = ids.len() - 6;
        assert_eq!(longer[..common], ids[..common]);
    }

    #[test]
    fn multi_line_templates_render_as_transformers_does() {
        let json = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../data/tokenizers/byte-bpe/tokenizer.json"),
        )
        .expect("reads");
        // Block tags on lines of their own, indented, and a Python string method.
        let template = "{% for m in messages %}\n  {% if m['role'].startswith('sys') %}\n[S]{{ m['content'].strip() }}\n  {% else %}\n[{{ m['role'] }}]{{ m['content'] }}\n  {% endif %}\n{% endfor %}";
        let t = ChatTokenizer::from_json(&json, Some(template.into()), "", "").expect("loads");
        let out = t
            .render_chat(&[
                Message {
                    role: "system",
                    content: "  be brief ",
                },
                Message {
                    role: "user",
                    content: "hi",
                },
            ])
            .expect("renders");
        assert_eq!(out, "[S]be brief\n[user]hi\n");
    }

    #[test]
    fn bad_templates_and_roles_are_errors() {
        let t = ours();
        let e = t
            .chat_ids(&[Message {
                role: "wizard",
                content: "x",
            }])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown role wizard"), "{e}");
        let json = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../data/tokenizers/byte-bpe/tokenizer.json"),
        )
        .expect("reads");
        let e = ChatTokenizer::from_json(&json, Some("{% for %}".into()), "", "").unwrap_err();
        assert!(matches!(e, TokenizeError::Template(_)), "{e}");
        let none = ChatTokenizer::from_json(&json, None, "", "").expect("loads");
        assert!(matches!(
            none.chat_ids(&[Message {
                role: "user",
                content: "x"
            }]),
            Err(TokenizeError::NoTemplate)
        ));
        assert!(!none.prompt_ids("the tenant").expect("encodes").is_empty());
        assert!(ChatTokenizer::from_json(b"{}", None, "", "").is_err());
        let e = ChatTokenizer::from_dir_files(Path::new("/nonexistent/tokenizer.json"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/tokenizer.json"), "{e}");
    }
}
