//! How both engines encode the values they store (JSON payloads as TEXT, ids as TEXT, seqs as
//! 64-bit signed integers) and the text patterns they search with.

use crate::error::StoreError;
use crate::id::{MessageId, SessionId};

/// Encodes a JSON payload for a TEXT column (exactly `serde_json::to_string`).
pub(crate) fn json_text(value: &serde_json::Value) -> Result<String, StoreError> {
    Ok(serde_json::to_string(value)?)
}

/// Decodes a TEXT column holding JSON; a malformed payload is [`StoreError::Json`].
pub(crate) fn json_value(text: &str) -> Result<serde_json::Value, StoreError> {
    Ok(serde_json::from_str(text)?)
}

/// Decodes a stored session id.
pub(crate) fn session_id(s: String) -> Result<SessionId, StoreError> {
    SessionId::new(s).map_err(|e| StoreError::Inconsistent(format!("stored session id: {e}")))
}

/// Decodes a stored message id.
pub(crate) fn message_id(s: String) -> Result<MessageId, StoreError> {
    MessageId::new(s).map_err(|e| StoreError::Inconsistent(format!("stored message id: {e}")))
}

/// A seq as a 64-bit signed column value, saturating (seqs never come near `i64::MAX`).
pub(crate) fn seq_param(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// Escapes `%`, `_` and `\` for a `LIKE … ESCAPE '\'` pattern.
pub(crate) fn escape_like(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
