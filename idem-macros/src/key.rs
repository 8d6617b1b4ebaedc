//! Key templates: `"coupon:{msg.topic}:{msg.id}"` split into literal text
//! and placeholders, with byte ranges for precise error spans.

use std::ops::Range;

/// One piece of a key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Literal text (braces unescaped).
    Lit(String),
    /// A `{root.member.member}` placeholder.
    Placeholder(Placeholder),
}

/// A placeholder naming a parameter and an optional field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// The text between the braces.
    pub text: String,
    /// The parameter it names.
    pub root: String,
    /// The field path after the parameter.
    pub members: Vec<String>,
    /// Byte range of the placeholder (braces included) in the template.
    pub range: Range<usize>,
}

/// A template error, with the byte range it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    /// What is wrong.
    pub message: String,
    /// Where, in the template's bytes (`None`: the whole template).
    pub range: Option<Range<usize>>,
}

fn err(message: impl Into<String>, range: Option<Range<usize>>) -> TemplateError {
    TemplateError {
        message: message.into(),
        range,
    }
}

/// Parses a key template. `{{` and `}}` are literal braces.
pub(crate) fn parse(template: &str) -> Result<Vec<Segment>, Vec<TemplateError>> {
    if template.is_empty() {
        return Err(vec![err(
            "the key template is empty: name the message fields that identify the action, \
             e.g. `key = \"coupon:{msg.id}\"`",
            None,
        )]);
    }
    let bytes = template.as_bytes();
    let mut segments = Vec::new();
    let mut errors = Vec::new();
    let mut lit = String::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' if bytes.get(i + 1) == Some(&b'{') => {
                lit.push('{');
                i += 2;
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => {
                lit.push('}');
                i += 2;
            }
            b'{' => {
                let start = i;
                let Some(len) = template[i + 1..].find(['}', '{']) else {
                    errors.push(err(
                        "unclosed `{` in the key template (write `{{` for a literal brace)",
                        Some(start..template.len()),
                    ));
                    break;
                };
                let end = i + 1 + len;
                if bytes[end] == b'{' {
                    errors.push(err(
                        "unclosed `{` in the key template (write `{{` for a literal brace)",
                        Some(start..end),
                    ));
                    i = end;
                    continue;
                }
                let range = start..end + 1;
                match placeholder(&template[i + 1..end], range.clone()) {
                    Ok(p) => {
                        if !lit.is_empty() {
                            segments.push(Segment::Lit(std::mem::take(&mut lit)));
                        }
                        segments.push(Segment::Placeholder(p));
                    }
                    Err(e) => errors.push(e),
                }
                i = end + 1;
            }
            b'}' => {
                errors.push(err(
                    "unmatched `}` in the key template (write `}}` for a literal brace)",
                    Some(i..i + 1),
                ));
                i += 1;
            }
            _ => {
                let ch = template[i..].chars().next().expect("in bounds");
                lit.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    if !lit.is_empty() {
        segments.push(Segment::Lit(lit));
    }
    if errors.is_empty()
        && !segments
            .iter()
            .any(|s| matches!(s, Segment::Placeholder(_)))
    {
        errors.push(err(
            "the key template has no placeholder: a constant key makes every call after the \
             first a duplicate; add the parameter that identifies the message, e.g. `{msg.id}`",
            None,
        ));
    }
    if errors.is_empty() {
        errors = check_separators(template, &segments);
    }
    if errors.is_empty() {
        Ok(segments)
    } else {
        Err(errors)
    }
}

/// Whether `c` may appear in an encoded key part: RFC 3986 unreserved
/// characters, and `%` of the `%XX` escapes (the runtime percent-encodes
/// every other byte of a part).
pub(crate) fn in_encoded_part(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '%')
}

/// The rules that make keys decode uniquely: every placeholder is followed
/// by the end of the template or by text starting with a separator, a
/// character an encoded part never contains. Each part is then the maximal
/// run of unreserved characters and `%XX` escapes after the text before it.
fn check_separators(template: &str, segments: &[Segment]) -> Vec<TemplateError> {
    let mut errors = Vec::new();
    for pair in segments.windows(2) {
        let Segment::Placeholder(p) = &pair[0] else {
            continue;
        };
        match &pair[1] {
            Segment::Placeholder(q) => errors.push(err(
                format!(
                    "`{{{}}}` follows `{{{}}}` with no text between them, so the key would not \
                     say where one ends and the other begins: put a separator between them, \
                     e.g. `{{{}}}:{{{}}}`",
                    q.text, p.text, p.text, q.text
                ),
                Some(p.range.start..q.range.end),
            )),
            Segment::Lit(text) => {
                let c = text.chars().next().expect("literals are not empty");
                if in_encoded_part(c) {
                    // The character as written: `{{`/`}}` are two bytes.
                    let at = p.range.end;
                    let len = template[at..].chars().next().map_or(1, char::len_utf8);
                    let p = &p.text;
                    let suggestion = if c.is_ascii_alphanumeric() || c == '%' {
                        format!("`{{{p}}}:{text}`")
                    } else {
                        format!(
                            "`{{{p}}}:{}` instead of `{{{p}}}{text}`",
                            &text[c.len_utf8()..]
                        )
                    };
                    errors.push(err(
                        format!(
                            "`{{{p}}}` is followed by `{c}`, a character a key part may contain, \
                             so the key would not say where the part ends: start the text after \
                             a placeholder with a separator such as `:`, `/`, `|`, `#`, `@` or \
                             `,`, e.g. {suggestion}"
                        ),
                        Some(at..at + len),
                    ));
                }
            }
        }
    }
    errors
}

fn placeholder(text: &str, range: Range<usize>) -> Result<Placeholder, TemplateError> {
    if text.trim().is_empty() {
        return Err(err(
            "empty placeholder `{}`: name a parameter, e.g. `{msg.id}`",
            Some(range),
        ));
    }
    let mut parts = text.split('.');
    let root = parts.next().unwrap_or_default();
    let members: Vec<&str> = parts.collect();
    let is_ident = |s: &str| {
        let mut c = s.chars();
        matches!(c.next(), Some(f) if f.is_alphabetic() || f == '_')
            && c.all(|c| c.is_alphanumeric() || c == '_')
    };
    let is_index = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !is_ident(root) || root == "_" || !members.iter().all(|m| is_ident(m) || is_index(m)) {
        return Err(err(
            format!(
                "`{{{text}}}` is not a parameter path: expected `{{name}}` or `{{name.field}}`"
            ),
            Some(range),
        ));
    }
    Ok(Placeholder {
        text: text.to_string(),
        root: root.to_string(),
        members: members.into_iter().map(str::to_string).collect(),
        range,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ph(text: &str, range: Range<usize>) -> Segment {
        let mut parts = text.split('.');
        Segment::Placeholder(Placeholder {
            text: text.into(),
            root: parts.next().unwrap().into(),
            members: parts.map(Into::into).collect(),
            range,
        })
    }

    #[test]
    fn splits_literals_and_placeholders() {
        let s = parse("coupon:{msg.topic}:{msg.id}").unwrap();
        assert_eq!(
            s,
            vec![
                Segment::Lit("coupon:".into()),
                ph("msg.topic", 7..18),
                Segment::Lit(":".into()),
                ph("msg.id", 19..27),
            ]
        );
    }

    #[test]
    fn escapes_braces() {
        let s = parse("{{x}}:{id}").unwrap();
        assert_eq!(s, vec![Segment::Lit("{x}:".into()), ph("id", 6..10)]);
    }

    #[test]
    fn tuple_index_members() {
        assert_eq!(parse("{pair.0}").unwrap(), vec![ph("pair.0", 0..8)]);
    }

    #[test]
    fn rejects_bad_templates() {
        let msg = |t: &str| parse(t).unwrap_err()[0].message.clone();
        assert!(msg("").contains("empty"));
        assert!(msg("coupon").contains("no placeholder"));
        assert!(msg("a:{msg.id").contains("unclosed"));
        assert!(msg("a:msg.id}").contains("unmatched"));
        assert!(msg("a:{}").contains("empty placeholder"));
        assert!(msg("a:{msg id}").contains("not a parameter path"));
        assert!(msg("a:{msg..id}").contains("not a parameter path"));
        assert!(msg("a:{{x}}").contains("no placeholder"));
    }

    #[test]
    fn placeholders_need_a_separator_after_them() {
        let first = |t: &str| parse(t).unwrap_err().remove(0);
        let e = first("c:{a}{b}");
        assert!(e.message.contains("no text between them"), "{}", e.message);
        assert_eq!(e.range, Some(2..8));
        for (t, at) in [("c:{a}-{b}", 5), ("c:{a}x", 5), ("{a}.{b}", 3), ("{a}%", 3)] {
            let e = first(t);
            assert!(
                e.message.contains("a key part may contain"),
                "{t}: {}",
                e.message
            );
            assert_eq!(e.range, Some(at..at + 1), "{t}");
        }
        for ok in [
            "c:{a}:{b}",
            "c:{a}/{b}|{c}#{d}@{e},{f}",
            "{a}",
            "x-{a}",
            "{a}{{}}",
            "{a}}}",
            "{a}é",
            "{a} {b}",
        ] {
            assert!(parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn reports_every_error() {
        assert_eq!(parse("{}:{a b}").unwrap_err().len(), 2);
    }

    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        /// Every rejection has a message and a range inside the template,
        /// on character boundaries (the expansion points inside the string
        /// with it); every acceptance obeys the separator rules.
        fn check(t: &str) {
            match parse(t) {
                Ok(segments) => {
                    assert!(!segments.is_empty());
                    for pair in segments.windows(2) {
                        if let Segment::Placeholder(_) = &pair[0] {
                            match &pair[1] {
                                Segment::Lit(l) => {
                                    assert!(!in_encoded_part(l.chars().next().unwrap()), "{t:?}")
                                }
                                Segment::Placeholder(_) => panic!("adjacent placeholders in {t:?}"),
                            }
                        }
                    }
                }
                Err(errors) => {
                    assert!(!errors.is_empty(), "{t:?}");
                    for e in errors {
                        assert!(!e.message.is_empty(), "{t:?}");
                        if let Some(r) = e.range {
                            assert!(r.start < r.end && r.end <= t.len(), "{t:?}: {r:?}");
                            assert!(
                                t.is_char_boundary(r.start) && t.is_char_boundary(r.end),
                                "{t:?}: {r:?}"
                            );
                        }
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(20_000))]

            #[test]
            fn any_string(t in any::<String>()) {
                check(&t);
            }

            /// Strings dense in braces, dots, separators and identifiers,
            /// the characters the parser branches on.
            #[test]
            fn template_like_strings(t in "[{}{}{}a-c_.0-9:%/ é-]{0,32}") {
                check(&t);
            }
        }
    }
}
