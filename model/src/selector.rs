//! Label selectors, as the API defines them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Matches a label selector. An empty selector matches everything.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    for (k, v) in selector.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Ok(false);
        }
    }
    for expr in selector.match_expressions.iter().flatten() {
        let values = expr.values.as_deref().unwrap_or_default();
        let value = labels.get(&expr.key);
        let ok = match expr.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => !value.is_some_and(|v| values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(format!(
                    "matchExpressions key {:?}: unknown operator {other:?}",
                    expr.key
                ))
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}
