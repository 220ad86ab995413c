//! What the journal says came of a signal and of a server call: enums in memory, the same
//! words on disk as ever ("delivered", "already gone", "error: …"; "ok", "error", "refused",
//! "cancelled"), so every journal written before reads back.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// What came of one signal sent through a pidfd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delivery {
    Delivered,
    /// The process had exited: the words of a skipped target that was gone.
    Gone,
    /// The kernel refused it: why, in words ("permission denied: …").
    Failed(String),
}

const DELIVERED: &str = "delivered";
const FAILED: &str = "error: ";

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Delivery::Delivered => f.write_str(DELIVERED),
            Delivery::Gone => fmt::Display::fmt(&crate::process::skip::SkipReason::Gone, f),
            Delivery::Failed(why) => write!(f, "{FAILED}{why}"),
        }
    }
}

impl Serialize for Delivery {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The journal on disk is text: its words are read back here, and only here. Words no
/// gpuloop writes make the line no record, as an unknown front end does.
impl<'de> Deserialize<'de> for Delivery {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let words = String::deserialize(d)?;
        if words == DELIVERED {
            Ok(Delivery::Delivered)
        } else if words == Delivery::Gone.to_string() {
            Ok(Delivery::Gone)
        } else if let Some(why) = words.strip_prefix(FAILED) {
            Ok(Delivery::Failed(why.to_string()))
        } else {
            Err(serde::de::Error::custom(format!(
                "unknown signal outcome {words:?}"
            )))
        }
    }
}

/// How an MCP call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub(crate) enum CallResult {
    Ok,
    /// Bad arguments, an unknown tool, a failure: the model got an error.
    Error,
    /// The server's policy does not allow it.
    Refused,
    /// The client cancelled it.
    Cancelled,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words every journal line has carried read back as the same outcome.
    #[test]
    fn journal_outcome_words_read_back_as_the_same_outcome() {
        let cases = [
            (Delivery::Delivered, "delivered"),
            (Delivery::Gone, "already gone"),
            (
                Delivery::Failed("permission denied: pid 7 is root's".into()),
                "error: permission denied: pid 7 is root's",
            ),
        ];
        for (d, words) in cases {
            let json = serde_json::to_value(&d).unwrap();
            assert_eq!(json, serde_json::Value::String(words.into()));
            assert_eq!(d.to_string(), words);
            assert_eq!(serde_json::from_value::<Delivery>(json).unwrap(), d);
        }
        assert!(serde_json::from_str::<Delivery>("\"maybe\"").is_err());
        for (r, words) in [
            (CallResult::Ok, "ok"),
            (CallResult::Error, "error"),
            (CallResult::Refused, "refused"),
            (CallResult::Cancelled, "cancelled"),
        ] {
            let json = serde_json::to_value(r).unwrap();
            assert_eq!(json, serde_json::Value::String(words.into()));
            assert_eq!(r.to_string(), words);
            assert_eq!(serde_json::from_value::<CallResult>(json).unwrap(), r);
        }
    }
}
