//! Label selectors: whether one is valid, whether it matches.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub(super) static EMPTY_SELECTOR: LabelSelector = LabelSelector {
    match_expressions: None,
    match_labels: None,
};

/// A matchExpressions operator that label selectors do not have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("matchExpressions key {key:?}: unknown operator {operator:?}")]
pub struct UnknownOperator {
    pub key: String,
    pub operator: String,
}

/// Whether a selector's operators are all known (whatever labels it meets).
pub fn validate_selector(selector: &LabelSelector) -> Result<(), UnknownOperator> {
    for expr in selector.match_expressions.iter().flatten() {
        if !matches!(
            expr.operator.as_str(),
            "In" | "NotIn" | "Exists" | "DoesNotExist"
        ) {
            return Err(UnknownOperator {
                key: expr.key.clone(),
                operator: expr.operator.clone(),
            });
        }
    }
    Ok(())
}

/// A peer's selector that could not be evaluated: which one
/// ("namespaceSelector", "podSelector"), and why, as
/// [`selector_matches`] says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{selector}: {problem}")]
pub struct SelectorError {
    pub selector: &'static str,
    pub problem: String,
}

impl SelectorError {
    pub fn new(selector: &'static str, problem: impl std::fmt::Display) -> Self {
        SelectorError {
            selector,
            problem: problem.to_string(),
        }
    }
}

pub use palisade_model::selector::selector_matches;
