//! The principal of a TLS client certificate: Kafka's `ssl.principal.mapping.rules`.
//!
//! The same rules as the Python side's `ext_proc/tls_principal.py` (its docstring is the
//! reference; the unit tests below repeat its cases), so the principal the module
//! gives a mutual-TLS connection is the one the ext_proc path derives:
//!
//! - Rules are `DEFAULT` or `RULE:pattern/replacement/[LU]`, comma-separated, a
//!   backslash escaping the next character; they are split and parsed with the very
//!   regular expressions the Python side uses (Kafka's own grammar).
//! - The first rule whose pattern matches the WHOLE name gives the replacement, `$n`
//!   being group n (a group the pattern lacks stays literal, `\x` is x), lower- (`/L`)
//!   or upper-cased (`/U`); `DEFAULT` gives the name as it is; no rule matching is an
//!   error: the client is refused, as a broker refuses it.
//! - Patterns are RE2 on the Python side and the `regex` crate here (both linear time,
//!   same syntax). Where the two differ they are made to agree: `\d \w \s \b` (and
//!   their negations) are ASCII, as in RE2, and a `[` inside a class is a literal.
//!   A pattern RE2 takes and this crate refuses (`\C`, `\Q..\E`) refuses the
//!   configuration, with the rule named.
//! - The name is the certificate's subject (RFC 2253, as Envoy gives it), or with
//!   `principal_from: uri_san` its first URI SAN.

use regex::{Captures, Regex};
use std::sync::OnceLock;

pub const SUBJECT: &str = "subject";
pub const URI_SAN: &str = "uri_san";
const DEFAULT_RULES: &str = "DEFAULT";
/// The longest pattern the Python side compiles (`filter_rules.patterns`).
const MAX_PATTERN_LENGTH: usize = 4096;

// Kafka's grammar, as ext_proc/tls_principal.py writes it.
const RULE: &str = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)(.*?)|(.*?)";

fn splitter() -> &'static Regex {
    static SPLITTER: OnceLock<Regex> = OnceLock::new();
    SPLITTER.get_or_init(|| Regex::new(&format!(r"\s*({RULE})\s*(?:,\s*|$)")).expect("a valid grammar"))
}

fn parser() -> &'static Regex {
    static PARSER: OnceLock<Regex> = OnceLock::new();
    PARSER.get_or_init(|| Regex::new(&format!(r"\A(?:{RULE})")).expect("a valid grammar"))
}

fn back_reference() -> &'static Regex {
    static REFERENCE: OnceLock<Regex> = OnceLock::new();
    REFERENCE.get_or_init(|| Regex::new(r"\$(\d+)|\\(.)").expect("a valid pattern"))
}

#[derive(Debug)]
struct Rule {
    /// None: DEFAULT.
    pattern: Option<Regex>,
    replacement: String,
    lower: bool,
    upper: bool,
}

impl Rule {
    fn apply(&self, name: &str) -> Option<String> {
        let Some(pattern) = &self.pattern else { return Some(name.to_string()) };
        let captures = pattern.captures(name)?;
        let result = substitute(&self.replacement, &captures, pattern.captures_len() - 1);
        Some(if self.lower {
            result.to_lowercase()
        } else if self.upper {
            result.to_uppercase()
        } else {
            result
        })
    }
}

/// Java's `Matcher.replaceAll` replacement on a whole-string match: `$n` is group n (a
/// group the pattern does not have stays literal, as Kafka escapes it), `\x` is x.
fn substitute(replacement: &str, captures: &Captures, groups: usize) -> String {
    back_reference()
        .replace_all(replacement, |m: &Captures| {
            if let Some(escaped) = m.get(2) {
                return escaped.as_str().to_string();
            }
            let digits = &m[1];
            match digits.parse::<usize>() {
                Ok(n) if n <= groups => captures.get(n).map_or(String::new(), |g| g.as_str().to_string()),
                _ => m[0].to_string(),
            }
        })
        .into_owned()
}

/// Kafka's `SslPrincipalMapper` for one rule text.
#[derive(Debug)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

impl PrincipalMapper {
    /// Parses Kafka's rule syntax (None or blank: DEFAULT); the error names the rule.
    pub fn parse(text: Option<&str>) -> Result<PrincipalMapper, String> {
        let source = match text.map(str::trim) {
            None | Some("") => DEFAULT_RULES,
            Some(text) => text,
        };
        let mut rules = Vec::new();
        for found in splitter().captures_iter(source) {
            let piece = found.get(1).map_or("", |m| m.as_str());
            if piece.is_empty() {
                continue;
            }
            let invalid = || format!("invalid ssl.principal.mapping.rules rule {piece:?}: expected DEFAULT or RULE:pattern/replacement/[LU]");
            let parsed = parser().captures(piece).ok_or_else(invalid)?;
            let whole = parsed.get(0).map_or(0, |m| m.end());
            if whole != piece.len() || parsed.get(6).is_some_and(|m| !m.is_empty()) {
                return Err(invalid());
            }
            if parsed.get(1).is_some() {
                rules.push(Rule { pattern: None, replacement: String::new(), lower: false, upper: false });
                continue;
            }
            if let Some(extra) = parsed.get(5).filter(|m| !m.is_empty()) {
                return Err(format!("invalid ssl.principal.mapping.rules rule {piece:?}: unexpected {:?} after the flags", extra.as_str()));
            }
            let pattern = &parsed[2];
            let compiled = compile(pattern)
                .map_err(|err| format!("invalid pattern in ssl.principal.mapping.rules rule {piece:?}: {err}"))?;
            let flags = &parsed[4];
            rules.push(Rule { pattern: Some(compiled), replacement: parsed[3].to_string(), lower: flags == "L", upper: flags == "U" });
        }
        if rules.is_empty() {
            return Err("ssl.principal.mapping.rules holds no rule".to_string());
        }
        Ok(PrincipalMapper { rules })
    }

    /// The mapped name (without `User:`); Err when no rule applies (the client is refused).
    pub fn name(&self, distinguished_name: &str) -> Result<String, String> {
        self.rules.iter().find_map(|rule| rule.apply(distinguished_name)).ok_or_else(|| {
            format!("no ssl.principal.mapping.rules rule applies to the certificate name {distinguished_name:?}")
        })
    }

    pub fn principal(&self, distinguished_name: &str) -> Result<String, String> {
        self.name(distinguished_name).map(|name| format!("User:{name}"))
    }
}

/// A whole-name match of an RE2 pattern, with RE2's meaning where the crate's differs.
fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.len() > MAX_PATTERN_LENGTH {
        return Err(format!("pattern is longer than {MAX_PATTERN_LENGTH} characters"));
    }
    Regex::new(&format!(r"\A(?:{})\z", as_re2(pattern))).map_err(|e| e.to_string().lines().last().unwrap_or("refused").trim().to_string())
}

/// `pattern` rewritten so that the `regex` crate reads it as RE2 does: Perl classes and
/// word boundaries are ASCII, and inside a class `[` (unless `[:name:]`) and the
/// crate's set operators (`&&`, `~~`, `--`) are literal characters.
fn as_re2(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    let mut class_start = false; // just after `[` or `[^`: a `]` here is a literal
    while let Some(c) = chars.next() {
        let at_start = std::mem::take(&mut class_start);
        match c {
            '\\' => match chars.next() {
                Some(p @ ('d' | 'D' | 'w' | 'W' | 's' | 'S')) => {
                    let set = match p.to_ascii_lowercase() {
                        'd' => "0-9",
                        'w' => "0-9A-Za-z_",
                        _ => r"\t\n\x0C\r ",
                    };
                    let negated = if p.is_ascii_uppercase() { "^" } else { "" };
                    out.push_str(&format!("[{negated}{set}]"));
                }
                Some(p @ ('b' | 'B')) if !in_class => out.push_str(&format!(r"(?-u:\{p})")),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            },
            '[' if !in_class => {
                in_class = true;
                class_start = true;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
            }
            '[' if chars.peek() == Some(&':') => {
                // `[:alpha:]` inside a class: the same in both.
                out.push('[');
                for n in chars.by_ref() {
                    out.push(n);
                    if n == ']' {
                        break;
                    }
                }
            }
            '[' | '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
            }
            '-' if in_class && chars.peek() == Some(&'-') => {
                out.push_str(r"\-");
            }
            ']' if in_class && !at_start => {
                in_class = false;
                out.push(']');
            }
            _ => out.push(c),
        }
    }
    out
}

/// The name the rules apply to: the subject, or the first URI SAN (as the ext_proc path
/// reads it from Envoy's comma-separated list); None when absent.
pub fn certificate_name(subject: Option<&str>, uri_sans: &[String], source: &str) -> Option<String> {
    if source == URI_SAN {
        let joined = uri_sans.join(",");
        let first = joined.split(',').next().unwrap_or("").trim();
        return (!first.is_empty()).then(|| first.to_string());
    }
    subject.filter(|s| !s.is_empty() && *s != "-").map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Kafka's own examples (SslPrincipalMapperTest, KIP-371), as in the Python tests.
    const KAFKA_RULES: &str = "RULE:^CN=([a-zA-Z0-9.]*),OU=ServiceUsers.*$/$1/L, \
        RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/U, \
        RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L, DEFAULT";

    fn map(rules: &str, name: &str) -> String {
        PrincipalMapper::parse(Some(rules)).unwrap().name(name).unwrap()
    }

    #[test]
    fn kafka_mapping_rules_map_as_kafka_does() {
        for (name, expected) in [
            ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
            ("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Santa Clara,ST=CA,C=US", "DUKE@JAVASOFT"),
            ("CN=Duke,OU=JavaSoft,O=Sun Microsystems", "duke"),
            ("OU=JavaSoft,O=Sun Microsystems", "OU=JavaSoft,O=Sun Microsystems"),
        ] {
            assert_eq!(map(KAFKA_RULES, name), expected, "{name}");
        }
    }

    #[test]
    fn rules_split_on_commas_outside_patterns_and_default_without_rules() {
        let mapper = PrincipalMapper::parse(Some("RULE:^CN=([^,]*),O=(.*)$/$2-$1/, RULE:^x$/y/")).unwrap();
        assert_eq!(mapper.rules.len(), 2);
        assert_eq!(mapper.principal("CN=alice,O=keg").unwrap(), "User:keg-alice");
        assert_eq!(PrincipalMapper::parse(None).unwrap().name("CN=a,O=b").unwrap(), "CN=a,O=b");
        assert_eq!(map("  ", "CN=a"), "CN=a");
    }

    #[test]
    fn no_matching_rule_refuses_like_kafka() {
        let err = PrincipalMapper::parse(Some("RULE:^CN=(.*),OU=svc$/$1/")).unwrap().name("CN=bob,OU=people").unwrap_err();
        assert!(err.contains("no ssl.principal.mapping.rules rule applies"), "{err}");
    }

    #[test]
    fn a_group_the_pattern_lacks_stays_literal_and_escapes_are_literal() {
        assert_eq!(map(r"RULE:^CN=(.*)$/$1-$2-\$1/", "CN=alice"), "alice-$2-$1");
    }

    #[test]
    fn bad_rules_are_refused_with_the_rule() {
        for text in ["RULE:x/y/Z", "FOO", "RULE:(/x/", "RULE:a/b/L extra", r"RULE:(a)\1/x/"] {
            let err = PrincipalMapper::parse(Some(text)).unwrap_err();
            assert!(err.contains("ssl.principal.mapping.rules"), "{text}: {err}");
        }
    }

    #[test]
    fn the_whole_name_must_match() {
        let mapper = PrincipalMapper::parse(Some("RULE:CN=([a-z]+)/$1/")).unwrap();
        assert!(mapper.name("CN=alice,O=keg").is_err());
        assert_eq!(mapper.name("CN=alice").unwrap(), "alice");
        assert!(mapper.name("CN=alice\n").is_err(), "no end-of-line leniency");
    }

    #[test]
    fn patterns_mean_what_they_mean_in_re2() {
        // Perl classes are ASCII, `[` in a class is literal, escaped '/' is '/'.
        assert!(PrincipalMapper::parse(Some(r"RULE:^CN=(\d+)$/$1/")).unwrap().name("CN=١٢").is_err());
        assert_eq!(map(r"RULE:^CN=(\w+)\b.*$/$1/", "CN=bob-x"), "bob");
        assert_eq!(map(r"RULE:^CN=([[a]+)$/$1/", "CN=[a["), "[a[");
        assert_eq!(map(r"RULE:^CN=([\d\s]+)$/$1/", "CN=1 2"), "1 2");
        assert_eq!(map(r"RULE:^CN=([^\D]+)$/$1/", "CN=42"), "42");
        assert_eq!(map(r"RULE:^CN=([]a]+)$/$1/", "CN=]a"), "]a");
        assert_eq!(map(r"RULE:^CN=([a&&b]+)$/$1/", "CN=&a"), "&a");
        assert_eq!(map(r"RULE:^CN=([[:alpha:]]+)$/$1/", "CN=ab"), "ab");
        assert_eq!(map(r"RULE:^spiffe:\/\/keg\/ns\/(.*)\/sa\/(.*)$/$2.$1/", "spiffe://keg/ns/eng/sa/alice"), "alice.eng");
        assert_eq!(map("RULE:^(?i)cn=(.*)$/$1/U", "CN=Émile"), "ÉMILE");
    }

    #[test]
    fn certificate_principal_from_subject_or_uri_san() {
        let sans = vec!["spiffe://keg/ns/eng/sa/alice".to_string(), "spiffe://other".to_string()];
        assert_eq!(certificate_name(Some("CN=alice,OU=eng,O=keg"), &sans, SUBJECT).as_deref(), Some("CN=alice,OU=eng,O=keg"));
        assert_eq!(certificate_name(Some("CN=alice"), &sans, URI_SAN).as_deref(), Some("spiffe://keg/ns/eng/sa/alice"));
        assert_eq!(certificate_name(Some(""), &[], SUBJECT), None);
        assert_eq!(certificate_name(None, &[], URI_SAN), None);
        assert_eq!(certificate_name(Some("-"), &[], SUBJECT), None, "Envoy's empty substitution");
    }
}
