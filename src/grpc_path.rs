//! The request path of a gRPC call, `/package.Service/Method`, split into its names.

/// Splits a gRPC request path `/service/method` into `(service, method)`, such as
/// `"/helloworld.Greeter/SayHello"` into `("helloworld.Greeter", "SayHello")`.
///
/// `None` unless the path is exactly a `/`, a non-empty service, a `/` and a non-empty
/// method: no leading `/`, no second `/`, an empty service or method, or a third `/` is
/// not a gRPC path. Nothing else is checked (a `?`, a space or a service without a
/// package passes), and nothing is decoded or trimmed: the names are slices of `path`.
pub(crate) fn split(path: &str) -> Option<(&str, &str)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    if service.is_empty() || method.is_empty() || method.contains('/') {
        return None;
    }
    Some((service, method))
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn splits_service_and_method() {
        assert_eq!(
            split("/helloworld.Greeter/SayHello"),
            Some(("helloworld.Greeter", "SayHello"))
        );
        assert_eq!(split("/a.B/C"), Some(("a.B", "C")));
        // A service without a package is still a service.
        assert_eq!(split("/S/M"), Some(("S", "M")));
    }

    #[test]
    fn needs_a_leading_slash() {
        for path in ["a.B/C", "a.B", " /a.B/C"] {
            assert_eq!(split(path), None, "{path:?}");
        }
    }

    #[test]
    fn needs_a_non_empty_service_and_method() {
        for path in ["", "/", "//", "/a.B", "/a.B/", "//C"] {
            assert_eq!(split(path), None, "{path:?}");
        }
    }

    #[test]
    fn refuses_a_third_slash() {
        for path in ["/a/B/C", "/a.B/C/", "//a.B/C", "/a.B//C"] {
            assert_eq!(split(path), None, "{path:?}");
        }
    }

    #[test]
    fn checks_nothing_but_the_slashes() {
        // The names are taken as they are: no trimming, no decoding, no character rules.
        assert_eq!(split("/a B/C?x=1"), Some(("a B", "C?x=1")));
        assert_eq!(split("/a%2FB/C"), Some(("a%2FB", "C")));
        assert_eq!(split("/é.S/M "), Some(("é.S", "M ")));
    }
}
