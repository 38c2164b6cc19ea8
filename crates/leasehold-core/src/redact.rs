//! Store URLs as messages and `Debug` show them: with every password hidden. One function for
//! every store and the CLI, so no store's error or log line leaks a secret another one hides.

/// `url` with every password replaced by `***`: the one in its userinfo
/// (`scheme://user:password@host` → `scheme://user:***@host`) and the value of every query
/// parameter whose name ends in `password` (`?sentinel_password=…`). Anything that does not
/// parse as a URL is returned as it is, minus a userinfo's password if one can be told apart.
///
/// ```
/// use leasehold_core::redact_url;
/// assert_eq!(redact_url("redis://alice:s3cret@127.0.0.1:6379/0"), "redis://alice:***@127.0.0.1:6379/0");
/// assert_eq!(
///     redact_url("redis+sentinel://a:pw@s1,s2/m?sentinel_password=x&sentinel_user=u"),
///     "redis+sentinel://a:***@s1,s2/m?sentinel_password=***&sentinel_user=u"
/// );
/// assert_eq!(redact_url("etcd://10.0.0.1:2379"), "etcd://10.0.0.1:2379");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let mut shown = match rest[..authority_end].rfind('@') {
        // The password is what follows the userinfo's first colon (a user name has none).
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end], &rest[at..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    };
    if let Some(query_start) = shown.find('?') {
        let query = shown[query_start + 1..]
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if name.ends_with("password") => format!("{name}=***"),
                _ => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("&");
        shown.truncate(query_start + 1);
        shown.push_str(&query);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_password_is_hidden_and_nothing_else_changes() {
        for (url, shown) in [
            ("redis://:s3cret@h:1", "redis://:***@h:1"),
            ("redis://alice@h:1", "redis://alice@h:1"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            (
                "etcd://al%40ce:p%3Ass@h1:2379,h2:2379?prefix=app:",
                "etcd://al%40ce:***@h1:2379,h2:2379?prefix=app:",
            ),
            ("etcd://u:p@w@h:1", "etcd://u:***@h:1"),
            ("etcd://h:1?x=1&password=p", "etcd://h:1?x=1&password=***"),
            ("not a url", "not a url"),
            ("redis://h:1/0?password", "redis://h:1/0?password"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
