//! Where outbox events go: a [`Destination`] (a bus, a topic, a queue), and the allow-list of
//! destinations an outbox may publish to, which its deployer names once and hands to both
//! ends. A producer's [`Outbox`](super::Outbox) refuses, at commit, an event for a
//! destination not on it (nothing is written); the relay's and the sweeper's
//! [`Publisher`](crate::lambda::relay::Publisher) never publishes an item that names one anyway
//! (written by another producer, or by one that runs with a longer list mid-deploy): it fails
//! and stays pending, retried by the stream and then the sweeper, whose last try parks it.
//!
//! How both ends share it: the variable [`DESTINATIONS_VAR`] (`OUTBOX_DESTINATIONS`), set from
//! the same template value on the producing functions, the relay and the sweeper
//! (template.yaml gives each `!Ref OrderEventsQueue`); [`Destinations::from_env`] refuses to
//! start without it (`*` allows any destination, on purpose). A destination is named as its event
//! names it: the queue URL, the topic ARN, the bus name or ARN.
//!
//! ```
//! use lambda_idempotency::effects::{Destination, Destinations};
//!
//! let queue = "https://sqs.eu-west-1.amazonaws.com/1/orders";
//! let allowed = Destinations::only([queue]);
//! assert!(allowed.allows(&Destination::Sqs { queue_url: queue.into() }));
//! assert!(!allowed.allows(&Destination::Sqs { queue_url: "https://elsewhere".into() }));
//! assert!(Destinations::any().allows(&Destination::Sqs { queue_url: "https://elsewhere".into() }));
//! ```

use std::collections::BTreeSet;

use crate::error::ConfigError;

/// Where an outbox event is published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Destination {
    /// An EventBridge bus (`PutEvents`): the bus name or ARN, the event's `Source` and
    /// `DetailType`; the envelope is the `Detail`.
    EventBridge {
        /// The event bus name or ARN.
        bus: String,
        /// The event's `Source`.
        source: String,
        /// The event's `DetailType`.
        detail_type: String,
    },
    /// An SNS topic (`Publish`); a FIFO topic (`.fifo`) deduplicates on the event id.
    Sns {
        /// The topic ARN.
        topic_arn: String,
    },
    /// An SQS queue (`SendMessage`); a FIFO queue (`.fifo`) deduplicates on the event id.
    Sqs {
        /// The queue URL.
        queue_url: String,
    },
}

impl Destination {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::EventBridge { .. } => "eventbridge",
            Self::Sns { .. } => "sns",
            Self::Sqs { .. } => "sqs",
        }
    }

    /// What the destination is named by: the bus, the topic ARN, the queue URL.
    pub(crate) fn target(&self) -> &str {
        match self {
            Self::EventBridge { bus, .. } => bus,
            Self::Sns { topic_arn } => topic_arn,
            Self::Sqs { queue_url } => queue_url,
        }
    }
}

/// The characters SQS refuses in a message (its allowed set skips U+FFFE and U+FFFF), which
/// JSON may hold unescaped.
pub(crate) const SQS_REFUSED: [char; 2] = ['\u{fffe}', '\u{ffff}'];

/// `json` with [`SQS_REFUSED`] escaped: serde_json writes them as they are (inside strings
/// only), and SQS would refuse the message; escaped, it is the same JSON, which every
/// destination takes.
pub(crate) fn escaped_for_sqs(json: String) -> String {
    match json.contains(SQS_REFUSED) {
        true => json
            .replace('\u{fffe}', "\\ufffe")
            .replace('\u{ffff}', "\\uffff"),
        false => json,
    }
}

/// The variable that names the allowed destinations, separated by commas or whitespace.
pub const DESTINATIONS_VAR: &str = "OUTBOX_DESTINATIONS";

/// The destinations an outbox may publish to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Destinations {
    /// `None`: any destination (no list was named).
    allowed: Option<BTreeSet<String>>,
}

impl Destinations {
    /// Any destination: no allow-list (what a producer or relay without one does).
    pub fn any() -> Self {
        Self::default()
    }

    /// Only `targets` (queue URLs, topic ARNs, bus names or ARNs, as events name them).
    pub fn only<T: Into<String>>(targets: impl IntoIterator<Item = T>) -> Self {
        Self {
            allowed: Some(targets.into_iter().map(Into::into).collect()),
        }
    }

    /// The list [`DESTINATIONS_VAR`] names (separated by commas or whitespace); `*` allows
    /// any destination ([`Destinations::any`]), which must be asked for: a relay deployed
    /// without the variable would otherwise publish wherever an item says.
    ///
    /// # Errors
    /// [`ConfigError::MissingEnv`] when it is not set or names nothing (a template value
    /// that did not resolve, say); [`ConfigError::InvalidSetting`] when it names `*` beside
    /// destinations (which of the two was meant is unclear; the wider would be taken): set it
    /// to the destinations the outbox publishes to, or to `*` alone.
    ///
    /// ```
    /// use lambda_idempotency::effects::{DESTINATIONS_VAR, Destinations};
    ///
    /// assert_eq!(Destinations::parse("*"), Some(Destinations::any()));
    /// assert_eq!(
    ///     Destinations::parse("https://sqs.eu-west-1.amazonaws.com/1/orders, orders-bus"),
    ///     Some(Destinations::only(["https://sqs.eu-west-1.amazonaws.com/1/orders", "orders-bus"]))
    /// );
    /// assert_eq!(Destinations::parse(" , "), None);
    /// assert_eq!(Destinations::parse("orders-bus, *"), None);
    /// # let _ = DESTINATIONS_VAR;
    /// ```
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_var(&std::env::var(DESTINATIONS_VAR).unwrap_or_default())
    }

    /// [`Self::from_env`] for the variable's value (empty when it is unset).
    fn from_var(list: &str) -> Result<Self, ConfigError> {
        Self::parse(list).ok_or_else(|| match list.contains('*') {
            false => ConfigError::MissingEnv {
                name: DESTINATIONS_VAR,
                hint: "set it to the queue URLs, topic ARNs or buses the outbox publishes to (the same value on the producers, the relay and the sweeper), or to `*` alone to allow any",
            },
            true => ConfigError::InvalidSetting {
                setting: DESTINATIONS_VAR,
                reason: "`*` allows any destination and stands alone; otherwise list the queue URLs, topic ARNs or buses, separated by commas or spaces".into(),
            },
        })
    }

    /// The destinations `list` names, as [`DESTINATIONS_VAR`] holds them: `None` when it names
    /// none, or `*` beside destinations.
    pub fn parse(list: &str) -> Option<Self> {
        let targets: Vec<&str> = list
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|target| !target.is_empty())
            .collect();
        match targets.as_slice() {
            [] => None,
            ["*"] => Some(Self::any()),
            targets if targets.contains(&"*") => None,
            targets => Some(Self::only(targets.iter().copied())),
        }
    }

    /// Whether `destination` is allowed.
    pub fn allows(&self, destination: &Destination) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|allowed| allowed.contains(destination.target()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_list_is_a_missing_variable_and_a_star_beside_others_an_invalid_setting() {
        for unset in ["", " , \n"] {
            assert!(matches!(
                Destinations::from_var(unset),
                Err(ConfigError::MissingEnv {
                    name: DESTINATIONS_VAR,
                    ..
                })
            ));
        }
        assert!(matches!(
            Destinations::from_var("orders-bus, *"),
            Err(ConfigError::InvalidSetting {
                setting: DESTINATIONS_VAR,
                ..
            })
        ));
        assert_eq!(Destinations::from_var("*"), Ok(Destinations::any()));
    }
}
