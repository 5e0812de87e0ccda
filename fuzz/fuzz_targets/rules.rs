//! The rules file parser on arbitrary bytes: never panics, keeps at most MAX_RULES rules,
//! reports at most one problem per line, every rule it keeps prints back to itself, and
//! matching a kept rule against a few connections never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rsock_core::rules::{parse, Role, Rule, MAX_RULES};

fuzz_target!(|data: &[u8]| {
    let (rules, problems) = parse(data);
    let lines = data.split(|&b| b == b'\n').count();
    assert!(rules.len() <= MAX_RULES);
    assert!(rules.len() + problems.len() <= lines);
    let addrs = [
        "10.77.0.1:5000",
        "[::ffff:10.0.0.1]:22",
        "[fd00::1]:65535",
        "0.0.0.0:0",
    ]
    .map(|a| a.parse().ok());
    for r in &rules {
        let again = Rule::parse(r.line, &r.to_string());
        assert_eq!(again, Ok(Some(r.clone())), "{r}");
        for role in [Role::Client, Role::Server] {
            for a in addrs {
                let _ = r.matches("nc", role, a, a);
            }
        }
    }
});
