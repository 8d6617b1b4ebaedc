//! Where the console's pages live: at the root of their server, or under
//! a path prefix inside an application (`/ops/idem`), so that every link,
//! form, redirect and the session cookie stay under it.

/// A path prefix the console cannot be mounted at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountError {
    reason: String,
}

impl std::fmt::Display for MountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unusable mount path: {}", self.reason)
    }
}

impl std::error::Error for MountError {}

/// The console's path prefix: empty at the root, else `/a/b` (a leading
/// slash, none at the end).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Mount {
    base: String,
}

impl Mount {
    /// `/ops/idem` (or `/ops/idem/`): segments of letters, digits and
    /// `-._~`, none empty, `.` or `..`; `/` or `` is the root.
    pub(crate) fn new(path: &str) -> Result<Self, MountError> {
        let bad = |reason: String| Err(MountError { reason });
        let shown: String = path.chars().take(60).collect();
        let trimmed = path.strip_suffix('/').unwrap_or(path);
        if trimmed.is_empty() {
            return Ok(Mount::default());
        }
        let Some(rest) = trimmed.strip_prefix('/') else {
            return bad(format!("{shown:?} must start with `/`"));
        };
        for segment in rest.split('/') {
            if segment.is_empty() || segment == "." || segment == ".." {
                return bad(format!(
                    "{shown:?} has an empty, `.` or `..` segment (write it as /a/b)"
                ));
            }
            if let Some(c) = segment
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || "-._~".contains(*c)))
            {
                return bad(format!(
                    "{shown:?} holds {c:?}: a segment is letters, digits and -._~ only"
                ));
            }
        }
        Ok(Mount {
            base: trimmed.to_string(),
        })
    }

    /// The prefix itself (`` at the root).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The public URL path of the console's `path` (which starts with `/`):
    /// `/messages` is `/ops/idem/messages` when mounted there.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The path the session cookie is scoped to.
    pub(crate) fn cookie_path(&self) -> String {
        self.url("/")
    }
}

#[cfg(test)]
mod tests {
    use super::Mount;

    #[test]
    fn prefixes_are_normalised_or_refused() {
        assert_eq!(Mount::new("").unwrap().base(), "");
        assert_eq!(Mount::new("/").unwrap().base(), "");
        assert_eq!(Mount::new("/ops/idem").unwrap().base(), "/ops/idem");
        assert_eq!(Mount::new("/ops/idem/").unwrap().base(), "/ops/idem");
        assert_eq!(
            Mount::new("/ops/idem").unwrap().url("/messages"),
            "/ops/idem/messages"
        );
        assert_eq!(Mount::new("/ops").unwrap().cookie_path(), "/ops/");
        assert_eq!(Mount::new("/").unwrap().url("/"), "/");
        for bad in [
            "ops",
            "//ops",
            "/ops//idem",
            "/ops/../x",
            "/./x",
            "/{id}",
            "/ops/*rest",
            "/a b",
            "/é",
            "/a?b",
            "/a#b",
            "/a\\b",
        ] {
            let e = Mount::new(bad).unwrap_err();
            assert!(e.to_string().starts_with("unusable mount path"), "{e}");
        }
    }
}
