//! Input limits, checked before anything is read or written, so a bad input is refused whole
//! and never half-stored.
//!
//! JSON payloads (prompts, models) are checked for shape, nesting depth and encoded size. The
//! depth limit matters beyond taste: `serde_json` refuses to *decode* documents nested deeper
//! than 128 levels, so a deeper payload, once stored, could never be read back; and encoding a
//! pathologically deep value recurses once per level. The depth is measured without recursion,
//! before the payload is encoded.

use std::io;

use serde_json::Value;

use crate::error::{Error, Result};

/// The largest `limit` a listing or transcript page accepts.
pub const MAX_PAGE_SIZE: usize = 1000;

/// The longest title or search text accepted, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;

/// The deepest nesting of arrays and objects accepted in a prompt or model (a scalar is depth
/// 0, `{}` depth 1). Stored payloads are wrapped one or two levels deeper, well within what
/// `serde_json` decodes.
pub const MAX_JSON_DEPTH: usize = 64;

/// The largest model selection accepted, in bytes of JSON.
pub const MAX_MODEL_BYTES: usize = 16 * 1024;

/// The longest directory accepted, in bytes.
const MAX_DIRECTORY_BYTES: usize = 4096;

/// The longest agent name accepted, in bytes.
const MAX_NAME_BYTES: usize = 255;

/// A page size: `None` (everything) or `1..=MAX_PAGE_SIZE`.
pub(crate) fn limit(limit: Option<usize>) -> Result<()> {
    match limit {
        Some(n) if n == 0 || n > MAX_PAGE_SIZE => Err(Error::invalid(
            "limit",
            format!("must be between 1 and {MAX_PAGE_SIZE}, got {n}"),
        )),
        _ => Ok(()),
    }
}

/// A directory: at most 4096 bytes, no control characters.
pub(crate) fn directory(directory: &str) -> Result<()> {
    if directory.len() > MAX_DIRECTORY_BYTES || directory.chars().any(char::is_control) {
        return Err(Error::invalid(
            "directory",
            format!("longer than {MAX_DIRECTORY_BYTES} bytes or contains control characters"),
        ));
    }
    Ok(())
}

/// Free text (a search): at most [`MAX_TEXT_BYTES`], no control characters.
pub(crate) fn text(field: &'static str, text: &str) -> Result<()> {
    if text.len() > MAX_TEXT_BYTES || text.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            format!("longer than {MAX_TEXT_BYTES} bytes or contains control characters"),
        ));
    }
    Ok(())
}

/// A name (an agent): 1 to 255 bytes, no control characters.
pub(crate) fn name(field: &'static str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            format!("must be 1 to {MAX_NAME_BYTES} bytes without control characters"),
        ));
    }
    Ok(())
}

/// A prompt: a JSON object or string, nested at most [`MAX_JSON_DEPTH`] deep, at most
/// `max_bytes` bytes once encoded.
pub(crate) fn prompt(prompt: &Value, max_bytes: usize) -> Result<()> {
    payload("prompt", prompt, max_bytes)
}

/// A model selection: a JSON object or string, nested at most [`MAX_JSON_DEPTH`] deep, at most
/// [`MAX_MODEL_BYTES`] once encoded.
pub(crate) fn model(model: &Value) -> Result<()> {
    payload("model", model, MAX_MODEL_BYTES)
}

fn payload(field: &'static str, value: &Value, max_bytes: usize) -> Result<()> {
    if !(value.is_object() || value.is_string()) {
        return Err(Error::invalid(field, "must be a JSON object or string"));
    }
    let depth = depth(value);
    if depth > MAX_JSON_DEPTH {
        return Err(Error::invalid(
            field,
            format!("nested {depth} levels deep, deeper than {MAX_JSON_DEPTH}"),
        ));
    }
    if !encodes_within(value, max_bytes) {
        return Err(Error::invalid(
            field,
            format!("larger than {max_bytes} bytes of JSON"),
        ));
    }
    Ok(())
}

/// The nesting depth of arrays and objects in `value`, measured without recursion.
pub(crate) fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((value, level)) = stack.pop() {
        match value {
            Value::Array(items) => {
                deepest = deepest.max(level + 1);
                stack.extend(items.iter().map(|v| (v, level + 1)));
            }
            Value::Object(map) => {
                deepest = deepest.max(level + 1);
                stack.extend(map.values().map(|v| (v, level + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// Counts encoded bytes and stops the encoder as soon as they exceed the limit, so an
/// oversized payload is never encoded in full.
struct Budget {
    left: usize,
}

impl io::Write for Budget {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.left = self
            .left
            .checked_sub(buf.len())
            .ok_or_else(|| io::Error::other("over budget"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Whether `value` encodes (compact JSON, as stored) in at most `max_bytes` bytes.
pub(crate) fn encodes_within(value: &Value, max_bytes: usize) -> bool {
    serde_json::to_writer(Budget { left: max_bytes }, value).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn depth_counts_containers_only() {
        assert_eq!(depth(&json!("text")), 0);
        assert_eq!(depth(&json!({})), 1);
        assert_eq!(depth(&json!({"a": [1, {"b": []}]})), 4);
    }

    #[test]
    fn very_deep_values_are_measured_without_recursion() {
        let mut value = json!(0);
        for _ in 0..100_000 {
            value = Value::Array(vec![value]);
        }
        // Not `json!`: it would clone `value` through a recursive serialization.
        let mut map = serde_json::Map::new();
        map.insert("deep".into(), value);
        let wrapped = Value::Object(map);
        assert_eq!(depth(&wrapped), 100_001);
        assert!(prompt(&wrapped, usize::MAX).is_err());
        // Dropping a value this deep recurses once per level; leak it instead in this test.
        std::mem::forget(wrapped);
    }

    #[test]
    fn size_is_the_compact_encoding() {
        let value = json!({"text": "hello"});
        let encoded = serde_json::to_string(&value).map_or(0, |s| s.len());
        assert!(encodes_within(&value, encoded));
        assert!(!encodes_within(&value, encoded - 1));
    }

    #[test]
    fn prompts_must_be_objects_or_strings() {
        for bad in [json!(null), json!(1), json!(true), json!([1])] {
            assert!(matches!(
                prompt(&bad, 1024),
                Err(Error::InvalidInput {
                    field: "prompt",
                    ..
                })
            ));
        }
        assert!(prompt(&json!("hi"), 1024).is_ok());
        assert!(prompt(&json!({"text": "hi"}), 1024).is_ok());
    }

    #[test]
    fn limits_are_one_to_max_page() {
        assert!(limit(None).is_ok());
        assert!(limit(Some(1)).is_ok());
        assert!(limit(Some(MAX_PAGE_SIZE)).is_ok());
        assert!(limit(Some(0)).is_err());
        assert!(limit(Some(MAX_PAGE_SIZE + 1)).is_err());
    }
}
