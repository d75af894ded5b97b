//! The API key: read from the environment variable the config names, never printed.
//!
//! The key lives only here and in the `Authorization` header (marked sensitive). It has no `Display`,
//! its `Debug` is masked, and text that came back from a server is passed through [`ApiKey::redact`]
//! before it can reach an error, an event or a log.

use reqwest::header::HeaderValue;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "the API key variable {var} (model.api_key_env) is not set: export {var}=<your key>, or name another variable in model.api_key_env"
    )]
    Missing { var: String },
    #[error("the API key variable {var} (model.api_key_env) is empty")]
    Empty { var: String },
    #[error("the API key variable {var} (model.api_key_env) is not valid Unicode")]
    NotUnicode { var: String },
    #[error(
        "the API key in {var} (model.api_key_env) cannot be sent in an HTTP header: it has characters other than visible ASCII"
    )]
    NotAHeader { var: String },
}

#[derive(Clone)]
pub struct ApiKey {
    value: String,
    /// Where it came from, for messages (`$OPENAI_API_KEY`).
    source: String,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({}: ***)", self.source)
    }
}

impl ApiKey {
    /// Reads the key from the environment variable `var`.
    pub fn from_env(var: &str) -> Result<Self, KeyError> {
        let value = match std::env::var(var) {
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => {
                return Err(KeyError::Missing { var: var.into() });
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(KeyError::NotUnicode { var: var.into() });
            }
        };
        Self::new(value, var)
    }

    /// A key given directly (tests, embedding); `source` names it in messages.
    pub fn new(value: impl Into<String>, source: &str) -> Result<Self, KeyError> {
        let value = value.into().trim().to_string();
        let var = source.to_string();
        if value.is_empty() {
            return Err(KeyError::Empty { var });
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(KeyError::NotAHeader { var });
        }
        Ok(ApiKey { value, source: var })
    }

    /// Where the key came from (the variable's name), safe to print.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `Authorization: Bearer <key>`, marked sensitive so that HTTP debugging never prints it.
    pub fn bearer(&self) -> HeaderValue {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", self.value))
            .expect("visible ASCII, checked in ApiKey::new, is a valid header value");
        v.set_sensitive(true);
        v
    }

    /// `text` with every occurrence of the key masked (servers echo keys in 401 messages).
    pub fn redact(&self, text: &str) -> String {
        text.replace(&self.value, "***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_masked_everywhere_it_could_be_printed() {
        let k = ApiKey::new(" sk-unit-7f3a ", "UNIT_KEY").unwrap();
        assert_eq!(format!("{k:?}"), "ApiKey(UNIT_KEY: ***)");
        assert_eq!(
            k.redact("Incorrect API key provided: sk-unit-7f3a."),
            "Incorrect API key provided: ***."
        );
        assert!(k.bearer().is_sensitive());
        assert_eq!(k.bearer().to_str().unwrap(), "Bearer sk-unit-7f3a");
    }

    #[test]
    fn bad_keys_are_named_by_variable() {
        let e = ApiKey::from_env("KREFINE_UNIT_SURELY_UNSET_1d8e").unwrap_err();
        assert!(
            e.to_string()
                .contains("KREFINE_UNIT_SURELY_UNSET_1d8e (model.api_key_env) is not set"),
            "{e}"
        );
        assert!(matches!(
            ApiKey::new("  ", "V"),
            Err(KeyError::Empty { .. })
        ));
        let e = ApiKey::new("sk-\nsecret", "V").unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
    }
}
