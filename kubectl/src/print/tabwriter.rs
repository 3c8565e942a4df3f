//! A port of Go's `text/tabwriter` cell alignment (what `kubectl describe` writes through):
//! a column's width is set per block of consecutive lines that have a tab-terminated cell in
//! that column. Pure.

/// Align tab-separated `text` with `padding` spaces after the widest cell of each block.
pub fn tabwrite(text: &str, padding: usize) -> String {
    let lines: Vec<Vec<&str>> =
        text.split_inclusive('\n').map(|l| l.trim_end_matches('\n').split('\t').collect()).collect();
    let mut widths: Vec<Vec<usize>> = lines.iter().map(|l| vec![0; l.len()]).collect();
    format(&lines, &mut widths, 0, 0, lines.len(), padding);
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        for (c, cell) in l.iter().enumerate() {
            if c + 1 < l.len() {
                out.push_str(cell);
                let w = widths[i][c];
                out.push_str(&" ".repeat(w.saturating_sub(cell.chars().count())));
            } else {
                out.push_str(cell);
            }
        }
        if i + 1 < lines.len() || text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

fn format(lines: &[Vec<&str>], widths: &mut [Vec<usize>], col: usize, start: usize, end: usize, padding: usize) {
    let mut i = start;
    while i < end {
        if lines[i].len() > col + 1 {
            let mut j = i;
            let mut w = 0;
            while j < end && lines[j].len() > col + 1 {
                w = w.max(lines[j][col].chars().count());
                j += 1;
            }
            for row in widths.iter_mut().take(j).skip(i) {
                row[col] = w + padding;
            }
            format(lines, widths, col + 1, i, j, padding);
            i = j;
        } else {
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_align_separately() {
        let t = "Name:\tp\nService Account:\tdefault\nContainers:\n  web:\n    Image:\tbusybox\n    Port:\t80\n";
        assert_eq!(
            tabwrite(t, 2),
            "Name:             p\nService Account:  default\nContainers:\n  web:\n    Image:  busybox\n    Port:   80\n"
        );
    }
}
