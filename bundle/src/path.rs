//! Entry path rules: relative, normalized, no `..`, portable.

/// Checks that `path` is a safe, normalized, relative bundle path: `/`-separated non-empty
/// components, none `.` or `..`, no leading or trailing `/`, no backslash, NUL or control
/// characters, at most 4096 bytes and 255 bytes per component. Returns the broken rule.
pub fn check(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.starts_with('/') {
        return Err("absolute path");
    }
    if path.len() > 4096 {
        return Err("longer than 4096 bytes");
    }
    if path.chars().any(|c| c.is_control()) {
        return Err("control character");
    }
    if path.contains('\\') {
        return Err("backslash");
    }
    for component in path.split('/') {
        match component {
            "" => return Err("not normalized: empty component"),
            "." => return Err("not normalized: '.' component"),
            ".." => return Err("contains '..'"),
            c if c.len() > 255 => return Err("component longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn accepts_normal_relative_paths() {
        for p in [
            "a",
            "models/minilm/model.safetensors",
            "bin/airlock",
            "a.b/c-d_e",
        ] {
            assert_eq!(check(p), Ok(()), "{p}");
        }
    }

    #[test]
    fn rejects_each_rule() {
        let cases = [
            ("", "empty path"),
            ("/etc/passwd", "absolute path"),
            ("../x", "contains '..'"),
            ("a/../../x", "contains '..'"),
            ("a//b", "not normalized: empty component"),
            ("a/", "not normalized: empty component"),
            ("./a", "not normalized: '.' component"),
            ("a\\b", "backslash"),
            ("a\nb", "control character"),
            ("a\0b", "control character"),
        ];
        for (p, why) in cases {
            assert_eq!(check(p), Err(why), "{p:?}");
        }
        assert_eq!(
            check(&"x".repeat(256)),
            Err("component longer than 255 bytes")
        );
        assert_eq!(check(&"ab/".repeat(1500)), Err("longer than 4096 bytes"));
    }
}
