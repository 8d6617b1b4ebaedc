//! Query strings and form bodies, decoded (`application/x-www-form-urlencoded`).
//! A selection repeats its field (`id=1&id=2`), which is why this is not
//! serde: every value stays a string until a page parses it, with a clear
//! error naming the field.
//!
//! Values are taken exactly as sent, spaces included: topics, keys and
//! types are compared byte for byte where they are stored (`"pay "` and
//! `"pay"` are two topics), so a filter or a requeue must name the one the
//! form showed, not a trimmed neighbour. Only an empty value means "none"
//! (no filter); numbers alone are read with their spaces trimmed.

use crate::error::PageError;

#[derive(Debug, Default)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn query(q: Option<&str>) -> Self {
        Self::body(q.unwrap_or("").as_bytes())
    }

    pub(crate) fn body(b: &[u8]) -> Self {
        Params(form_urlencoded::parse(b).into_owned().collect())
    }

    /// The first value of `key`, exactly as sent; none when absent or
    /// empty.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// Every non-blank value of `key`, trimmed (for numbers).
    fn all_trimmed<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// The first value of `key` as [`get`](Self::get) gives it, checked as
    /// a filter: at most `max` bytes, no control characters (NUL, newline
    /// and the like, which no topic, key or type holds), else a 400 that
    /// says so, before any SQL.
    pub(crate) fn filter(&self, key: &str, max: usize) -> Result<Option<&str>, PageError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        if let Some(c) = v.chars().find(|c| c.is_control()) {
            return Err(PageError::BadRequest(format!(
                "`{key}` contains the control character {c:?}: no {key} does"
            )));
        }
        if v.len() > max {
            return Err(PageError::BadRequest(format!(
                "`{key}` is at most {max} bytes long, not {}",
                v.len()
            )));
        }
        Ok(Some(v))
    }

    /// `key` as an integer, if given (spaces around it allowed).
    pub(crate) fn int(&self, key: &str) -> Result<Option<i64>, PageError> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
            .map(|v| parse_int(key, v))
            .transpose()
    }

    /// Every `key` as an integer (spaces around each allowed).
    pub(crate) fn ints(&self, key: &str) -> Result<Vec<i64>, PageError> {
        self.all_trimmed(key).map(|v| parse_int(key, v)).collect()
    }
}

fn parse_int(key: &str, v: &str) -> Result<i64, PageError> {
    v.parse().map_err(|_| {
        let shown: String = v.chars().take(40).collect();
        PageError::BadRequest(format!("`{key}` must be a whole number, not {shown:?}"))
    })
}

/// A query string of these pairs (values encoded).
pub(crate) fn query_string<'a>(pairs: impl IntoIterator<Item = (&'a str, String)>) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, &v);
    }
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_fields_and_blanks() {
        let p = Params::query(Some(
            "id=1&id=+2+&id=&topic=a%20b&x=%E2%9C%93&t1=pay+&t2=+pay&t3=+&t4=&n=+7",
        ));
        assert_eq!(p.ints("id").unwrap(), vec![1, 2]);
        assert_eq!(p.get("topic"), Some("a b"));
        // Exactly as sent: a topic with spaces is its own topic.
        assert_eq!(p.get("t1"), Some("pay "));
        assert_eq!(p.get("t2"), Some(" pay"));
        assert_eq!(p.get("t3"), Some(" "));
        assert_eq!(p.get("t4"), None, "empty: no filter");
        assert_eq!(p.int("n").unwrap(), Some(7));
        assert_eq!(p.get("x"), Some("✓"));
        assert_eq!(p.get("missing"), None);
        assert!(Params::query(Some("id=1;DROP")).ints("id").is_err());
        assert_eq!(Params::query(None).int("after").unwrap(), None);
    }

    #[test]
    fn filters_hold_no_control_characters_and_have_a_length() {
        let p = Params::query(Some("a=x%00y&b=x%0Ay&c=%E2%9C%93&d=abcd&e=+&f="));
        assert!(p.filter("a", 10).is_err());
        assert!(p.filter("b", 10).is_err());
        assert_eq!(p.filter("c", 3).unwrap(), Some("✓"));
        assert!(p.filter("d", 3).is_err());
        assert_eq!(p.filter("e", 3).unwrap(), Some(" "));
        assert_eq!(p.filter("f", 3).unwrap(), None);
        assert_eq!(p.filter("missing", 3).unwrap(), None);
    }
}
