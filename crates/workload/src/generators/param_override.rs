//! `key=value` overrides of a workload's parameters, so a user can change one parameter (the
//! document pool, a length range) from the command line without a spec file.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::WorkloadParams;

/// An override that does not apply; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// Not of the form `key=value`.
    #[error("'{0}' is not of the form key=value")]
    Syntax(String),
    /// The workload has no such parameter.
    #[error("unknown parameter '{key}' (this workload has: {known})")]
    UnknownKey {
        /// The key given.
        key: String,
        /// The parameters this workload has, dotted.
        known: String,
    },
    /// The value does not fit the parameter's type or range.
    #[error("parameter '{key}': {why}")]
    Value {
        /// The key given.
        key: String,
        /// What is wrong.
        why: String,
    },
}

impl WorkloadParams {
    /// Sets one parameter from `key=value`. Keys are the parameter names as they appear in the
    /// report's `workload.params` object; nested fields are dotted (`question_tokens.min`).
    pub fn apply_override(&mut self, assignment: &str) -> Result<(), ParamError> {
        let (key, value) = assignment
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| ParamError::Syntax(assignment.to_string()))?;
        match self {
            WorkloadParams::LongContext(p) => patch(p, key, value),
            WorkloadParams::Sharegpt(p) => patch(p, key, value),
            WorkloadParams::Rag(p) => patch(p, key, value),
            WorkloadParams::Agent(p) => patch(p, key, value),
            WorkloadParams::HotPrefix(p) => patch(p, key, value),
            WorkloadParams::SharedSystemPrompt(p) => patch(p, key, value),
        }
    }
}

fn patch<T: Serialize + DeserializeOwned>(
    params: &mut T,
    key: &str,
    value: &str,
) -> Result<(), ParamError> {
    let mut tree = serde_json::to_value(&*params).map_err(|e| ParamError::Value {
        key: key.to_string(),
        why: e.to_string(),
    })?;
    let unknown = |tree: &serde_json::Value| ParamError::UnknownKey {
        key: key.to_string(),
        known: leaf_keys(tree, "").join(", "),
    };
    let mut slot = &mut tree;
    for part in key.split('.') {
        slot = match slot.get_mut(part) {
            Some(s) => s,
            None => {
                let tree = serde_json::to_value(&*params).unwrap_or_default();
                return Err(unknown(&tree));
            }
        };
    }
    if slot.is_object() {
        let tree = serde_json::to_value(&*params).unwrap_or_default();
        return Err(unknown(&tree));
    }
    // Numbers and booleans as JSON; anything else as a string.
    *slot = serde_json::from_str(value)
        .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    *params = serde_json::from_value(tree).map_err(|e| ParamError::Value {
        key: key.to_string(),
        why: format!("'{value}' does not fit: {e}"),
    })?;
    Ok(())
}

fn leaf_keys(tree: &serde_json::Value, prefix: &str) -> Vec<String> {
    match tree.as_object() {
        Some(map) => map
            .iter()
            .flat_map(|(k, v)| {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if v.is_object() {
                    leaf_keys(v, &path)
                } else {
                    vec![path]
                }
            })
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generators::{WorkloadKind, WorkloadSpec};

    fn long_context() -> WorkloadParams {
        WorkloadSpec::default_for(WorkloadKind::LongContext).params
    }

    #[test]
    fn sets_a_top_level_and_a_nested_parameter() {
        let mut p = long_context();
        p.apply_override("documents=1200").unwrap();
        p.apply_override("question_tokens.max = 90").unwrap();
        let WorkloadParams::LongContext(lc) = p else {
            panic!("kind changed")
        };
        assert_eq!(lc.documents, 1200);
        assert_eq!(lc.question_tokens.max, 90);
    }

    #[test]
    fn names_the_key_and_what_is_wrong() {
        let mut p = long_context();
        let e = p.apply_override("docs=3").unwrap_err().to_string();
        assert!(
            e.contains("unknown parameter 'docs'") && e.contains("documents"),
            "{e}"
        );
        let e = p.apply_override("documents=many").unwrap_err().to_string();
        assert!(e.starts_with("parameter 'documents'"), "{e}");
        let e = p.apply_override("documents=-5").unwrap_err().to_string();
        assert!(e.starts_with("parameter 'documents'"), "{e}");
        assert_eq!(
            p.apply_override("documents").unwrap_err(),
            ParamError::Syntax("documents".into())
        );
        let e = p
            .apply_override("question_tokens=5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("question_tokens.min"), "{e}");
        assert_eq!(p, long_context(), "a failed override changes nothing");
    }
}
