//! Which rule derived a record's key and fingerprint: every record says so, so that a rule
//! kept for records an older version wrote applies to those records only.

/// The rule that derived a stored key and fingerprint, as the record says.
///
/// Versions before 0.5 wrote no marker: 0.1 derived keys and fingerprints with RFC 8785 alone
/// (every integer read as a double), 0.2 to 0.4 with exact integers, and a record of theirs
/// cannot say which of the two wrote it. 0.5 on marks every record it claims
/// [`KeyRule::ExactIntegers`]; the 0.1 compatibility rule
/// ([`ConfigBuilder::rfc8785_records_before`](crate::config::ConfigBuilder::rfc8785_records_before))
/// applies only to [`KeyRule::Unstated`] records created before the instant the deployer names.
///
/// ```
/// use lambda_idempotency::key::KeyRule;
/// use lambda_idempotency::Fingerprint;
///
/// let fingerprint = Fingerprint::of(&serde_json::json!({"amount": 10}))?;
/// assert_eq!(fingerprint.rule(), KeyRule::ExactIntegers);
/// assert_eq!(Fingerprint::from_stored(fingerprint.as_str()).rule(), KeyRule::Unstated);
/// assert_eq!(KeyRule::from_stored(Some(2)), KeyRule::ExactIntegers);
/// # Ok::<(), lambda_idempotency::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum KeyRule {
    /// The record does not say (a version before 0.5 wrote it).
    #[default]
    Unstated,
    /// Canonical JSON with every integer exact ([`canonical_json`](super::canonical_json)):
    /// stored as `2`.
    ExactIntegers,
    /// Another rule, stored as this number (a later version wrote it): never read under the
    /// 0.1 compatibility rule.
    Other(u32),
}

impl KeyRule {
    /// The rule this version derives keys and fingerprints with.
    pub const CURRENT: Self = Self::ExactIntegers;

    /// The number stored for the rule, or `None` for [`KeyRule::Unstated`] (nothing is stored).
    pub const fn stored(self) -> Option<u32> {
        match self {
            Self::Unstated => None,
            Self::ExactIntegers => Some(2),
            Self::Other(number) => Some(number),
        }
    }

    /// The rule a record names by the number it stores (`None`: it stores none).
    pub const fn from_stored(stored: Option<u32>) -> Self {
        match stored {
            None => Self::Unstated,
            Some(2) => Self::ExactIntegers,
            Some(number) => Self::Other(number),
        }
    }
}
