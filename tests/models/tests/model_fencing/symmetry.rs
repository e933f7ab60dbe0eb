//! Symmetry reduction: a representative of a state's orbit.

use super::*;

/// A state symmetric to `s` (the protocol does not tell clients apart, nor
/// nodes, once the clock offsets move with the nodes): clients sorted by what
/// they are doing, then nodes by what they hold. Not a canonical form (ties
/// are broken arbitrarily), which only costs some reduction: any state of the
/// same orbit is a sound representative, since the properties are symmetric.
pub(super) fn representative(s: &State) -> State {
    fn phase_bytes(p: Phase) -> [u8; 10] {
        match p {
            Phase::Idle => [0; 10],
            Phase::Acquiring { ok, read, fresh } => {
                [1, ok, read[0], read[1], read[2], fresh, 0, 0, 0, 0]
            }
            Phase::Fencing { t, applied } => [2, t, applied, 0, 0, 0, 0, 0, 0, 0],
            Phase::Holding { t } => [3, t, 0, 0, 0, 0, 0, 0, 0, 0],
        }
    }
    let pc = PER_CLIENT as usize;
    // Clients.
    let client_key = |c: usize| {
        let mut k = [0u8; 24];
        k[0] = s.clients[c].started;
        k[1..11].copy_from_slice(&phase_bytes(s.clients[c].phase));
        for j in 0..pc {
            let a = c * pc + j;
            k[11 + 6 * j] = s.sets[a];
            k[12 + 6 * j] = s.fences[a];
            k[13 + 6 * j] = s.fence_t[a];
            for (i, n) in s.nodes.iter().enumerate() {
                if n.key == Some(a as u8) {
                    k[14 + 6 * j] |= bit(i);
                }
                if n.lost == Some(a as u8) {
                    k[15 + 6 * j] |= bit(i);
                }
            }
        }
        k
    };
    let mut order: [usize; MAX_CLIENTS] = std::array::from_fn(|c| c);
    order.sort_by_key(|&c| client_key(c));
    let mut new_of = [0u8; MAX_CLIENTS];
    for (new, &old) in order.iter().enumerate() {
        new_of[old] = new as u8;
    }
    let rename = |a: u8| new_of[(a / PER_CLIENT) as usize] * PER_CLIENT + a % PER_CLIENT;
    let mut r = *s;
    for (new, &old) in order.iter().enumerate() {
        r.clients[new] = s.clients[old];
        for j in 0..pc {
            r.sets[new * pc + j] = s.sets[old * pc + j];
            r.fences[new * pc + j] = s.fences[old * pc + j];
            r.fence_t[new * pc + j] = s.fence_t[old * pc + j];
        }
    }
    for n in &mut r.nodes {
        n.key = n.key.map(rename);
        n.lost = n.lost.map(rename);
    }
    // Nodes.
    let s = r;
    let node_key = |i: usize| {
        let n = &s.nodes[i];
        let mut k = [0u8; 7 + 2 * MAX_ATTEMPTS + 4 * MAX_CLIENTS];
        k[..7].copy_from_slice(&[
            s.offsets[i],
            u8::from(n.up),
            n.key.map_or(0, |a| a + 1),
            n.counter,
            n.down_ticks,
            n.lost.map_or(0, |a| a + 1),
            n.idle_ticks,
        ]);
        for a in 0..MAX_ATTEMPTS {
            k[7 + 2 * a] = (s.sets[a] >> i) & 1;
            k[8 + 2 * a] = (s.fences[a] >> i) & 1;
        }
        let base = 7 + 2 * MAX_ATTEMPTS;
        for (c, cl) in s.clients.iter().enumerate() {
            let (ok, read, at, applied) = match cl.phase {
                Phase::Acquiring { ok, read, fresh } => {
                    ((ok >> i) & 1, read[i], (fresh >> i) & 1, 0)
                }
                Phase::Fencing { applied, .. } => (0, 0, 0, (applied >> i) & 1),
                _ => (0, 0, 0, 0),
            };
            k[base + 4 * c..base + 4 * c + 4].copy_from_slice(&[ok, read, at, applied]);
        }
        k
    };
    let mut order: [usize; N] = std::array::from_fn(|i| i);
    order.sort_by_key(|&i| node_key(i));
    let remap = |mask: u8| {
        let mut m = 0;
        for (new, &old) in order.iter().enumerate() {
            if mask & bit(old) != 0 {
                m |= bit(new);
            }
        }
        m
    };
    let permute = |v: [u8; N]| -> [u8; N] { std::array::from_fn(|new| v[order[new]]) };
    let mut r = s;
    for (new, &old) in order.iter().enumerate() {
        r.nodes[new] = s.nodes[old];
        r.offsets[new] = s.offsets[old];
    }
    for a in 0..MAX_ATTEMPTS {
        r.sets[a] = remap(s.sets[a]);
        r.fences[a] = remap(s.fences[a]);
    }
    for cl in &mut r.clients {
        cl.phase = match cl.phase {
            Phase::Acquiring { ok, read, fresh } => Phase::Acquiring {
                ok: remap(ok),
                read: permute(read),
                fresh: remap(fresh),
            },
            Phase::Fencing { t, applied } => Phase::Fencing {
                t,
                applied: remap(applied),
            },
            p => p,
        };
    }
    r
}
