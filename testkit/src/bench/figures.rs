//! The benchmark's figures, declared up front.

use super::report::{Figures, Kind};

/// Declares every figure up front, so a part not run shows as `na`.
pub(super) fn declare(figs: &mut Figures) {
    use Kind::*;
    for (key, unit, kind) in [
        ("rt.n", "CRs", Info),
        (
            "rt.wall_hibernate_s",
            "s, create N Hibernate CRs → all Hibernated",
            Time,
        ),
        ("rt.wall_wake_s", "s, flip N to Wake → all Active", Time),
        (
            "rt.sim_hibernate_s",
            "s, the simulator's own time (request seen → last write) for the last CR Hibernated",
            Info,
        ),
        (
            "rt.overhead_hibernate_s",
            "s, controller overhead: wall_hibernate − sim_hibernate",
            Time,
        ),
        (
            "rt.sim_wake_s",
            "s, the simulator's own time for the last CR Active",
            Info,
        ),
        (
            "rt.overhead_wake_s",
            "s, controller overhead: wall_wake − sim_wake",
            Time,
        ),
        (
            "rt.reaction_hibernate_p50_ms",
            "ms, reaction: vk's last pod write → the product's terminal status write (audit)",
            Time,
        ),
        ("rt.reaction_hibernate_p99_ms", "ms", Tail),
        ("rt.reaction_wake_p50_ms", "ms", Time),
        ("rt.reaction_wake_p99_ms", "ms", Tail),
        ("rt.reaction_p99_ms", "ms, both directions", Tail),
        ("rt.reaction_max_ms", "ms", Tail),
        (
            "rt.seen_reaction_hibernate_p50_ms",
            "ms, the same as the bench's watches saw both writes (its CR watch lags its flips)",
            Info,
        ),
        ("rt.seen_reaction_hibernate_p99_ms", "ms", Info),
        ("rt.seen_reaction_wake_p50_ms", "ms", Info),
        ("rt.seen_reaction_wake_p99_ms", "ms", Info),
        (
            "rt.intake_hibernate_p50_ms",
            "ms, intake: the CR's create → the product's pod patch (audit)",
            Time,
        ),
        ("rt.intake_hibernate_p99_ms", "ms", Tail),
        (
            "rt.intake_wake_p50_ms",
            "ms, intake: the flip to Wake → the product's pod patch (audit)",
            Time,
        ),
        ("rt.intake_wake_p99_ms", "ms", Tail),
        ("rt.intake_p99_ms", "ms, both directions", Tail),
        (
            "rt.product_reaction_p99_ms",
            "ms, inside the product: its cache saw vk's last write → terminal write (bucket bound)",
            Info,
        ),
        (
            "rt.writes_per_round",
            "transition writes per CR: finalizer, pod patches, phase writes, events",
            Count,
        ),
        (
            "rt.all_writes_per_round",
            "every product API write per CR, events included",
            Count,
        ),
        ("rt.events_per_round", "of which events", Count),
        ("rt.pod_writes_per_round", "of which pod patches", Count),
        (
            "rt.cr_writes_per_round",
            "of which CR writes (finalizer, status)",
            Count,
        ),
        (
            "rt.phase_writes",
            "status changes moving the phase (watch)",
            Info,
        ),
        (
            "rt.reason_writes",
            "per CR: status writes that leave the phase as it was (audit)",
            Count,
        ),
        (
            "rt.same_phase_changes",
            "status changes keeping the phase, Ready reason only (watch)",
            Info,
        ),
        (
            "rt.other_status_writes",
            "other status changes (watch)",
            Count,
        ),
        (
            "rt.conflicts",
            "409s to the product in the round (audit)",
            Count,
        ),
        (
            "rt.conflict_errors_metric",
            "reconcile_errors{error=conflict}",
            Count,
        ),
        (
            "rt.non_2xx_writes",
            "product writes answered ≥ 300 (audit)",
            Count,
        ),
        ("rt.registry_calls_per_hibernate", "per CR", Count),
        (
            "rt.registry_calls_per_wake",
            "per CR, flip → settled",
            Count,
        ),
        (
            "rt.sim_writes_per_round",
            "simulator + driver writes per CR",
            Info,
        ),
        (
            "fresh.writes_per_cr",
            "product writes per new Wake CR on a running pod",
            Count,
        ),
        ("fresh.registry_calls_per_cr", "per CR", Count),
        ("quiet.window_s", "s", Info),
        ("quiet.writes", "product API writes in the window", Count),
        ("quiet.registry_calls", "in the window", Count),
        ("quiet.reconcile_passes", "in the window", Info),
        ("adm.crs_1k", "CRs in the namespace", Info),
        ("adm.rps_c16_1k", "req/s", Rate),
        ("adm.p50_c16_1k_ms", "ms", Time),
        ("adm.p99_c16_1k_ms", "ms", Tail),
        ("adm.rps_c64_1k", "req/s", Rate),
        ("adm.p50_c64_1k_ms", "ms", Time),
        ("adm.p99_c64_1k_ms", "ms", Tail),
        ("adm.ceiling_rps_c16", "req/s, no-op axum+rustls", Rate),
        ("adm.ceiling_rps_c64", "req/s, no-op axum+rustls", Rate),
        ("adm.ceiling_p99_c64_ms", "ms", Tail),
        ("adm.rps_c16_10k", "req/s", Rate),
        ("adm.rps_c64_10k", "req/s", Rate),
        ("adm.p50_c64_10k_ms", "ms", Time),
        ("adm.p99_c64_10k_ms", "ms", Tail),
        (
            "adm.ceiling_share",
            "ours c64 (10k, else 1k) / ceiling c64",
            Rate,
        ),
        ("scale.n", "pods and CRs", Info),
        ("scale.pod_json_bytes", "bytes per pod (JSON)", Info),
        ("scale.rss_empty_mib", "MiB, empty namespace", Memory),
        ("scale.startup_cold_s", "s to /readyz, first start", Time),
        ("scale.settle_s", "s, first start → all Active", Time),
        (
            "scale.rss_settled_mib",
            "MiB after the first start settled",
            Memory,
        ),
        (
            "scale.hwm_settled_mib",
            "MiB peak (VmHWM) of the first start",
            Memory,
        ),
        (
            "scale.startup_s",
            "s to /readyz, restart in a settled world (median)",
            Time,
        ),
        (
            "scale.startup_cpu_s",
            "s of product CPU from start to /readyz, restart (median)",
            Time,
        ),
        (
            "scale.restart_passes_s",
            "s from /readyz to the end of the initial pass over every CR (median)",
            Time,
        ),
        (
            "scale.rss_mib",
            "MiB VmRSS after the restart's initial pass",
            Memory,
        ),
        ("scale.hwm_mib", "MiB VmHWM of the restart", Memory),
        (
            "scale.bytes_per_object",
            "(RSS − empty RSS) / (pods + CRs)",
            Memory,
        ),
        ("scale50k.n", "pods and CRs", Info),
        ("scale50k.startup_cold_s", "s to /readyz, first start", Time),
        ("scale50k.settle_s", "s, first start → all Active", Time),
        (
            "scale50k.rss_settled_mib",
            "MiB after the first start settled",
            Memory,
        ),
        (
            "scale50k.hwm_settled_mib",
            "MiB peak (VmHWM) of the first start",
            Memory,
        ),
        (
            "scale50k.kib_per_object_settled",
            "KiB, (settled RSS − empty RSS) / (pods + CRs)",
            Memory,
        ),
        (
            "scale50k.startup_s",
            "s to /readyz, restart in a settled world (median)",
            Time,
        ),
        (
            "scale50k.startup_cpu_s",
            "s of product CPU from start to /readyz, restart (median)",
            Time,
        ),
        (
            "scale50k.rss_mib",
            "MiB VmRSS after the restart's initial pass",
            Memory,
        ),
        ("scale50k.hwm_mib", "MiB VmHWM of the restart", Memory),
        (
            "scale50k.kib_per_object",
            "KiB, (RSS − empty RSS) / (pods + CRs), after the restart",
            Memory,
        ),
        (
            "scale50k.others_n",
            "plain pods of other workloads beside them",
            Info,
        ),
        (
            "scale50k.others_startup_s",
            "s to /readyz, every namespace, no selector (median)",
            Time,
        ),
        (
            "scale50k.others_startup_cpu_s",
            "s of product CPU to /readyz, no selector (median)",
            Time,
        ),
        (
            "scale50k.others_passes_s",
            "s to the initial pass's end, no selector (median)",
            Time,
        ),
        (
            "scale50k.others_rss_mib",
            "MiB VmRSS, every namespace, no selector",
            Memory,
        ),
        ("scale50k.others_hwm_mib", "MiB VmHWM, no selector", Memory),
        (
            "scale50k.others_kib_per_pod",
            "KiB per plain pod, no selector (RSS − the 50k RSS) / N",
            Memory,
        ),
        (
            "scale50k.others_selector_startup_s",
            "s to /readyz, every namespace, --pod-selector (median)",
            Time,
        ),
        (
            "scale50k.others_selector_startup_cpu_s",
            "s of product CPU to /readyz, --pod-selector (median)",
            Time,
        ),
        (
            "scale50k.others_selector_passes_s",
            "s to the initial pass's end, --pod-selector (median)",
            Time,
        ),
        (
            "scale50k.others_selector_rss_mib",
            "MiB VmRSS, every namespace, --pod-selector",
            Memory,
        ),
        (
            "scale50k.others_selector_hwm_mib",
            "MiB VmHWM, --pod-selector",
            Memory,
        ),
        ("sched.n", "pods of one schedule", Info),
        (
            "sched.flip_s",
            "s, hibernate boundary → all N Hibernated",
            Time,
        ),
        (
            "sched.writes_per_pod",
            "schedule CR writes per pod for one boundary (target 1)",
            Count,
        ),
        ("idle.n", "pods of one idle policy", Info),
        (
            "idle.decision_lag_p50_s",
            "s, idle instant → desire flipped, p50",
            Time,
        ),
        (
            "idle.decision_lag_s",
            "s, idle instant → desire flipped, p99 (target < 5)",
            Tail,
        ),
        ("idle.decision_lag_max_s", "s, the same, max", Tail),
        (
            "idle.decision_lag_min_s",
            "s, the same, min (negative: flipped before idle)",
            Info,
        ),
        (
            "idle.activity_writes_per_vm_min",
            "Lease writes per VM per minute at one report a second, per reporter (target <= 6)",
            Count,
        ),
        (
            "idle.activity_writes_both_per_vm_min",
            "the same, for VMs both the proxy and keepalive report for",
            Count,
        ),
    ] {
        figs.set(key, None, unit, kind);
    }
}
