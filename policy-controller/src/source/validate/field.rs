//! Field paths and field errors, printed as the API server prints them
//! (`spec.ingress[1].from[0]: Required value: must specify a peer`), so an
//! operator reads the same words from Palisade and from `kubectl apply`.

use std::fmt;

/// A path to a field: `spec.ingress[1].ports[0].port`, `metadata.labels`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Path(String);

impl Path {
    pub fn new(root: &str) -> Self {
        Path(root.to_string())
    }

    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    pub fn index(&self, i: usize) -> Self {
        Path(format!("{}[{i}]", self.0))
    }

    /// A map entry, as upstream's `Path.Key`: `metadata.annotations[a/b]`.
    pub fn key(&self, key: &str) -> Self {
        Path(format!("{}[{key}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What is wrong with a field; the variants are upstream's error types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Strict field validation: the type has no such field.
    UnknownField,
    /// The same key twice in one object.
    DuplicateField,
    /// The value does not decode as the field's type.
    Type(String),
    Required(String),
    /// `value` is already rendered (`"abc"`, `70`).
    Invalid {
        value: String,
        detail: String,
    },
    NotSupported {
        value: String,
        supported: &'static [&'static str],
    },
    Forbidden(String),
    Duplicate(String),
    TooMany {
        got: usize,
        max: usize,
    },
    TooLong {
        max: usize,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::UnknownField => f.write_str("unknown field"),
            Problem::DuplicateField => f.write_str("duplicate field"),
            Problem::Type(message) => f.write_str(message),
            Problem::Required(detail) if detail.is_empty() => f.write_str("Required value"),
            Problem::Required(detail) => write!(f, "Required value: {detail}"),
            Problem::Invalid { value, detail } => write!(f, "Invalid value: {value}: {detail}"),
            Problem::NotSupported { value, supported } => {
                let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                write!(
                    f,
                    "Unsupported value: {value}: supported values: {}",
                    list.join(", ")
                )
            }
            Problem::Forbidden(detail) => write!(f, "Forbidden: {detail}"),
            Problem::Duplicate(value) => write!(f, "Duplicate value: {value}"),
            Problem::TooMany { got, max } => {
                write!(f, "Too many: {got}: must have at most {max} items")
            }
            Problem::TooLong { max } => write!(f, "Too long: may not be more than {max} bytes"),
        }
    }
}

/// One problem at one field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct FieldError {
    pub path: Path,
    pub problem: Problem,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.as_str().is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "{}: {}", self.path, self.problem)
        }
    }
}

/// Every error of an object on one line, as errors name them.
pub fn joined(errors: &[FieldError]) -> String {
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    errors.join("; ")
}

/// Collects the errors of one object, in the order the checks find them.
#[derive(Debug, Default)]
pub struct Errors(pub Vec<FieldError>);

impl Errors {
    pub fn push(&mut self, path: &Path, problem: Problem) {
        self.0.push(FieldError {
            path: path.clone(),
            problem,
        });
    }

    pub fn required(&mut self, path: &Path, detail: &str) {
        self.push(path, Problem::Required(detail.to_string()));
    }

    pub fn invalid(&mut self, path: &Path, value: impl Rendered, detail: impl Into<String>) {
        self.push(
            path,
            Problem::Invalid {
                value: value.rendered(),
                detail: detail.into(),
            },
        );
    }

    /// One Invalid error per message, as upstream loops over a check's
    /// messages.
    pub fn invalid_each(
        &mut self,
        path: &Path,
        value: impl Rendered + Copy,
        messages: Vec<String>,
    ) {
        for m in messages {
            self.invalid(path, value, m);
        }
    }

    pub fn not_supported(
        &mut self,
        path: &Path,
        value: impl Rendered,
        supported: &'static [&'static str],
    ) {
        self.push(
            path,
            Problem::NotSupported {
                value: value.rendered(),
                supported,
            },
        );
    }

    pub fn forbidden(&mut self, path: &Path, detail: &str) {
        self.push(path, Problem::Forbidden(detail.to_string()));
    }

    pub fn duplicate(&mut self, path: &Path, value: impl Rendered) {
        self.push(path, Problem::Duplicate(value.rendered()));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_result(self) -> Result<(), Vec<FieldError>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

/// A value as an error prints it: strings quoted, numbers bare.
pub trait Rendered {
    fn rendered(&self) -> String;
}

impl Rendered for &str {
    fn rendered(&self) -> String {
        format!("{self:?}")
    }
}

impl Rendered for &String {
    fn rendered(&self) -> String {
        format!("{self:?}")
    }
}

impl Rendered for i32 {
    fn rendered(&self) -> String {
        self.to_string()
    }
}

impl Rendered for i64 {
    fn rendered(&self) -> String {
        self.to_string()
    }
}

impl Rendered for usize {
    fn rendered(&self) -> String {
        self.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_as_the_api_server_prints_them() {
        let p = Path::new("spec")
            .child("ingress")
            .index(1)
            .child("from")
            .index(0);
        let mut e = Errors::default();
        e.required(&p, "must specify a peer");
        e.required(&Path::new("spec").child("ports"), "");
        e.invalid(
            &p.child("port"),
            0,
            "must be between 1 and 65535, inclusive",
        );
        e.invalid(&Path::new("metadata").child("name"), "A", "bad");
        e.not_supported(
            &Path::new("spec").child("policyTypes").index(1),
            "Sideways",
            &["Ingress", "Egress"],
        );
        e.forbidden(&p, "may not specify both ipBlock and another peer");
        e.duplicate(&Path::new("x").key("a/b"), "http");
        e.push(&Path::new("spec").child("fromm"), Problem::UnknownField);
        e.push(
            &Path::new("items"),
            Problem::TooMany {
                got: 1001,
                max: 1000,
            },
        );
        e.push(
            &Path::new("metadata").child("annotations"),
            Problem::TooLong { max: 262144 },
        );
        let got: Vec<String> = e.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "spec.ingress[1].from[0]: Required value: must specify a peer",
                "spec.ports: Required value",
                "spec.ingress[1].from[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "metadata.name: Invalid value: \"A\": bad",
                "spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"",
                "spec.ingress[1].from[0]: Forbidden: may not specify both ipBlock and another peer",
                "x[a/b]: Duplicate value: \"http\"",
                "spec.fromm: unknown field",
                "items: Too many: 1001: must have at most 1000 items",
                "metadata.annotations: Too long: may not be more than 262144 bytes",
            ]
        );
    }
}
