//! Validated identifiers: [`SessionId`] and [`MessageId`].
//!
//! An id is a shared, immutable string (`Arc<str>`): cloning one, which the runtime does for
//! every map key, message and turn, copies a pointer instead of the text, and the registry's key
//! and the session actor share one allocation.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The longest id accepted, in bytes.
pub const MAX_ID_BYTES: usize = 255;

/// Why a string is not a valid id; it converts into
/// [`Error::InvalidInput`](crate::Error::InvalidInput) with the same field and reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid input: {field}: {reason}")]
pub struct InvalidId {
    /// Which id: `session_id` or `message_id`.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> InvalidId {
    InvalidId {
        field,
        reason: reason.into(),
    }
}

fn validate(field: &'static str, s: &str) -> Result<(), InvalidId> {
    if s.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if s.len() > MAX_ID_BYTES {
        return Err(invalid(
            field,
            format!("is {} bytes, longer than {MAX_ID_BYTES}", s.len()),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    Ok(())
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $field:literal, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `s`: non-empty, at most [`MAX_ID_BYTES`] bytes, no control characters.
            ///
            /// # Errors
            /// [`InvalidId`] when `s` breaks one of those rules.
            pub fn new(s: impl Into<String>) -> Result<Self, InvalidId> {
                let s: String = s.into();
                validate($field, &s)?;
                Ok(Self(s.into()))
            }

            /// A fresh, time-ordered, globally unique id.
            pub fn generate() -> Self {
                Self(fresh($prefix).into())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.0)
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, InvalidId> {
                Self::try_from(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidId;
            fn try_from(s: String) -> Result<Self, InvalidId> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidId;
            fn try_from(s: &str) -> Result<Self, InvalidId> {
                validate($field, s)?;
                Ok(Self(s.into()))
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.as_ref().to_owned()
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// The id of a session (`ses_…` when generated).
    SessionId,
    "session_id",
    "ses"
);
id_type!(
    /// The globally unique id of a message or prompt (`msg_…` when generated).
    MessageId,
    "message_id",
    "msg"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_empty_long_and_control_ids() {
        assert!(SessionId::new("").is_err());
        assert!(SessionId::new("a".repeat(256)).is_err());
        assert!(SessionId::new("a\nb").is_err());
        assert!(SessionId::new("a".repeat(255)).is_ok());
    }

    #[test]
    fn generated_ids_are_unique_and_valid() {
        let a = MessageId::generate();
        let b = MessageId::generate();
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("msg_"));
        assert!(MessageId::new(a.as_str()).is_ok());
    }

    #[test]
    fn clones_share_the_text() {
        let a = SessionId::new("ses_shared").unwrap();
        let b = a.clone();
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_eq!(String::from(b), "ses_shared");
        assert_eq!("ses_shared".parse::<SessionId>().unwrap(), a);
    }
}
