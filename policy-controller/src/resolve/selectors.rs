//! Label selectors: whether one is valid, whether it matches.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub(super) static EMPTY_SELECTOR: LabelSelector = LabelSelector {
    match_expressions: None,
    match_labels: None,
};

/// Whether a selector's operators are all known (whatever labels it meets).
pub fn validate_selector(selector: &LabelSelector) -> Result<(), String> {
    for expr in selector.match_expressions.iter().flatten() {
        if !matches!(
            expr.operator.as_str(),
            "In" | "NotIn" | "Exists" | "DoesNotExist"
        ) {
            return Err(format!(
                "matchExpressions key {:?}: unknown operator {:?}",
                expr.key, expr.operator
            ));
        }
    }
    Ok(())
}

pub use palisade_model::selector::selector_matches;
