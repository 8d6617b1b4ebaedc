//! CPU time spent by this process, by its waited-for children (pgbench)
//! and by the whole machine, read from `/proc` (Linux): to report CPU per
//! message on each side of a run, the client's and the rest (the local
//! database server, on an otherwise idle machine), since on a small
//! machine both share the cores.
//!
//! Resolution is the kernel's clock tick (usually 10 ms): read it over
//! runs of a second or more.

use std::time::Duration;

/// CPU times read at one moment (all zero where `/proc` cannot be read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cpu {
    /// This process, all its threads: user + system.
    pub own: Duration,
    /// Its children that exited and were waited for.
    pub children: Duration,
    /// The whole machine, every core: time not idle (`/proc/stat`).
    pub machine: Duration,
}

/// The kernel's clock ticks per second (`USER_HZ`), 100 on every Linux
/// build in use.
const TICKS: f64 = 100.0;

/// The `utime stime cutime cstime` fields of a `/proc/<pid>/stat` line,
/// in ticks, and its command.
fn stat_fields(line: &str) -> Option<(String, [u64; 4])> {
    // `pid (comm) state ppid …`: the command may hold spaces and
    // parentheses, so split at the last `)`.
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let comm = line.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
    // After the command: state(0) ppid(1) … utime(11) stime(12)
    // cutime(13) cstime(14).
    let field = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((comm, [field(11)?, field(12)?, field(13)?, field(14)?]))
}

fn ticks(t: u64) -> Duration {
    Duration::from_secs_f64(t as f64 / TICKS)
}

impl Cpu {
    /// The times now.
    pub fn now() -> Self {
        let mut cpu = Cpu::default();
        if let Some((_, [u, s, cu, cs])) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|l| stat_fields(&l))
        {
            cpu.own = ticks(u + s);
            cpu.children = ticks(cu + cs);
        }
        // `cpu  user nice system idle iowait irq softirq steal …`
        if let Some(line) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
        {
            let f: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect();
            if f.len() >= 8 {
                cpu.machine = ticks(f[0] + f[1] + f[2] + f[5] + f[6] + f[7]);
            }
        }
        cpu
    }

    /// What was spent between `earlier` and this reading.
    pub fn since(&self, earlier: &Cpu) -> Cpu {
        Cpu {
            own: self.own.saturating_sub(earlier.own),
            children: self.children.saturating_sub(earlier.children),
            machine: self.machine.saturating_sub(earlier.machine),
        }
    }

    /// The machine's time less this process's and its children's: the
    /// database server's, when nothing else runs.
    pub fn rest(&self) -> Duration {
        self.machine.saturating_sub(self.own + self.children)
    }
}

/// The CPU time (user + system, all its threads) of the process `pid`
/// so far, as `/proc/<pid>/stat` reads now; `None` when it cannot be read
/// (the process gone, no `/proc`). For a server the benchmark started
/// itself (a broker), whose share of the machine's time it reports apart.
pub fn of_process(pid: u32) -> Option<Duration> {
    let line = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, [u, s, _, _]) = stat_fields(&line)?;
    Some(ticks(u + s))
}

/// Microseconds of `d` per one of `n` messages.
pub fn per_message_us(d: Duration, n: i64) -> f64 {
    d.as_secs_f64() * 1e6 / n.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_a_command_holding_spaces_and_parentheses() {
        let line = "4242 (postgres: a (b) c) S 1 2 3 4 5 6 7 8 9 10 120 30 7 3 20 0 1 0";
        let (comm, f) = stat_fields(line).unwrap();
        assert_eq!(comm, "postgres: a (b) c");
        assert_eq!(f, [120, 30, 7, 3]);
        assert_eq!(stat_fields("garbage"), None);
    }

    #[test]
    fn this_process_has_spent_some_cpu() {
        let a = Cpu::now();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(Cpu::now().since(&a).own > Duration::ZERO);
        assert!(of_process(std::process::id()).is_some());
        assert_eq!(of_process(u32::MAX), None);
    }
}
