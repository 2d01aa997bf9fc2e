//! The lines of a Rust source outside its `#[cfg(test)]` items, for the tests that hold
//! non-test code to a rule (sizes, accepts, errors).

/// The lines of `text` outside `#[cfg(test)]` items, with their line numbers (from 1): each
/// such item is skipped from its attribute to the `;` or the brace that closes it (braces
/// counted per line, as formatted code writes them), wherever it stands in the file.
pub fn non_test_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if !line.trim_start().starts_with("#[cfg(test)]") {
            out.push((n + 1, line));
            continue;
        }
        let mut depth: i64 = 0;
        let mut opened = false;
        let mut current = line.trim_start().trim_start_matches("#[cfg(test)]");
        loop {
            let code = current.split("//").next().unwrap_or_default();
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (!opened && code.trim_end().ends_with(';')) || (opened && depth <= 0) {
                break;
            }
            match lines.next() {
                Some((_, next)) => current = next,
                None => break,
            }
        }
    }
    out
}
