//! A bench report for people (`to_table`) and for scripts (`to_json`).

use std::fmt::Write;

use uzram_engine::{format_size, MIN_GROUP_PAGES, PAGE_SIZE};

use super::BenchReport;

impl BenchReport {
    /// The raw codec compressing on one thread, pages per second (the engine's yardstick).
    pub fn raw_compress_pages_per_s(&self) -> f64 {
        self.raw_compress[0].1
    }

    /// The raw codec decompressing on one thread, pages per second.
    pub fn raw_decompress_pages_per_s(&self) -> f64 {
        self.raw_decompress[0].1
    }

    /// `(mem_used_total + table_bytes) / compr_data_size`: what storing the compressed bytes
    /// really costs, every byte of metadata included.
    pub fn memory_overhead(&self) -> f64 {
        let m = &self.stats.mm;
        (m.mem_used_total + self.stats.table_bytes) as f64 / m.compr_data_size.max(1) as f64
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let by_threads = |v: &[(usize, f64)]| {
            v.iter()
                .map(|(t, r)| (t.to_string(), serde_json::json!(r.round())))
                .collect::<serde_json::Map<_, _>>()
        };
        let m = &self.stats.mm;
        let mut json = serde_json::json!({
            "source": self.source,
            "algorithm": self.algorithm.name(),
            "level": self.level,
            "pages": self.pages,
            "threads": self.threads,
            "runs": self.runs,
            "orig_data_size": m.orig_data_size,
            "compr_data_size": m.compr_data_size,
            "mem_used_total": m.mem_used_total,
            "mem_used_max": m.mem_used_max,
            "table_bytes": self.stats.table_bytes,
            "pool_mapped_bytes": self.stats.pool_mapped_bytes,
            "same_pages": m.same_pages,
            "huge_pages": m.huge_pages,
            "memory_overhead": self.memory_overhead(),
            "raw_compress_pages_per_s": self.raw_compress_pages_per_s().round(),
            "raw_decompress_pages_per_s": self.raw_decompress_pages_per_s().round(),
            "raw_compress_pages_per_s_by_threads": by_threads(&self.raw_compress),
            "raw_decompress_pages_per_s_by_threads": by_threads(&self.raw_decompress),
            "fill_pages_per_s": by_threads(&self.fill_pages_per_s),
            "write_pages_per_s": by_threads(&self.write_pages_per_s),
            "read_pages_per_s": by_threads(&self.read_pages_per_s),
        });
        if let Some(w) = &self.writeback {
            let extra = serde_json::json!({
                "bd_pages_written": w.pages,
                "bd_bytes_written": w.bytes_written,
                "bd_bytes_written_raw_equivalent": w.bytes_raw_equivalent,
                "bd_bytes_ratio": w.bytes_written as f64 / w.bytes_raw_equivalent.max(1) as f64,
                "writeback_pages_per_s": (w.pages as f64 / w.seconds.max(1e-9)).round(),
                "mem_used_total_after_writeback": w.mem_used_total_after,
            });
            if let (Some(obj), serde_json::Value::Object(add)) = (json.as_object_mut(), extra) {
                obj.extend(add);
            }
        }
        if let Some(r) = &self.recompress {
            let extra = serde_json::json!({
                "mem_used_total_primary": r.mem_used_total_primary,
                "mem_used_total_after_recompress": r.mem_used_total_after,
                "recompress_memory_ratio": r.mem_used_total_after as f64 / r.mem_used_total_primary.max(1) as f64,
                "compr_data_size_after_recompress": r.compr_after,
                "recompressed_pages": r.stats.recompressed,
                "recompress_pages_compacted": r.stats.pages_compacted,
                "incompressible_pages": r.stats.incompressible,
                "recompress_pages_per_s": (r.stats.candidates as f64 / r.seconds.max(1e-9)).round(),
            });
            if let (Some(obj), serde_json::Value::Object(add)) = (json.as_object_mut(), extra) {
                obj.extend(add);
            }
            if let (Some(obj), Some(g)) = (json.as_object_mut(), &r.groups) {
                let add = serde_json::json!({
                    "groups": g.stats.groups,
                    "grouped_pages": g.stats.grouped_pages,
                    "compr_data_size_after_groups": g.compr_after,
                    "mem_used_total_after_groups": g.mem_used_total_after,
                    "groups_compr_ratio": g.compr_after as f64 / r.compr_after.max(1) as f64,
                    "groups_memory_ratio": g.mem_used_total_after as f64 / r.mem_used_total_after.max(1) as f64,
                    "group_pages_per_s": (g.stats.grouped_pages as f64 / g.seconds.max(1e-9)).round(),
                });
                if let serde_json::Value::Object(add) = add {
                    obj.extend(add);
                }
            }
        }
        json
    }

    /// The report as a short table for people.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "uzram bench: {} pages ({}) from {}, {} level {}, median of {} runs",
            self.pages,
            format_size(self.pages * PAGE_SIZE as u64),
            self.source,
            self.algorithm,
            self.level,
            self.runs
        );
        self.speed_table(&mut s);
        self.memory_lines(&mut s);
        self.slow_path_lines(&mut s);
        s
    }

    /// Rates by thread count, each against the raw codec, and the scaling.
    fn speed_table(&self, s: &mut String) {
        let _ = write!(s, "\n{:<16}", "");
        for (t, _) in &self.raw_compress {
            let _ = write!(
                s,
                " {:>20}",
                format!("{t} thread{}", if *t > 1 { "s" } else { "" })
            );
        }
        let _ = writeln!(s, " {:>9}", "scaling");
        let _ = write!(s, "{:<16}", "");
        for _ in &self.raw_compress {
            let _ = write!(s, " {:>11} {:>8}", "pages/s", "vs raw");
        }
        let _ = writeln!(s);
        type Rates<'a> = &'a [(usize, f64)];
        let rows: [(&str, Rates, Rates); 5] = [
            ("raw compress", &self.raw_compress, &self.raw_compress),
            ("engine fill", &self.fill_pages_per_s, &self.raw_compress),
            ("engine write", &self.write_pages_per_s, &self.raw_compress),
            ("raw decompress", &self.raw_decompress, &self.raw_decompress),
            ("engine read", &self.read_pages_per_s, &self.raw_decompress),
        ];
        for (label, v, raw) in rows {
            let _ = write!(s, "{label:<16}");
            for ((_, r), (_, base)) in v.iter().zip(raw) {
                let _ = write!(s, " {r:>11.0} {:>8.2}", r / base);
            }
            match v {
                [(_, one), .., (_, many)] if v.len() > 1 => {
                    let _ = writeln!(s, " {:>8.2}x", many / one);
                }
                _ => {
                    let _ = writeln!(s);
                }
            }
        }
        let _ = writeln!(
            s,
            "(fill: writes into the empty device, the pool growing; write: overwrites, steady state)"
        );
    }

    /// `mm_stat` after the first pass, the ratio, and what memory the pages cost in all.
    fn memory_lines(&self, s: &mut String) {
        let m = &self.stats.mm;
        let _ = writeln!(s, "\nmm_stat after the first write pass:\n{m}");
        let _ = writeln!(
            s,
            "ratio orig/compr {:.2}; same pages {}; huge pages {}",
            m.orig_data_size as f64 / m.compr_data_size.max(1) as f64,
            m.same_pages,
            m.huge_pages
        );
        let _ = writeln!(
            s,
            "memory: pool {} + metadata {} = {:.4} x compr_data_size ({:.4} x orig)",
            format_size(m.mem_used_total),
            format_size(self.stats.table_bytes),
            self.memory_overhead(),
            (m.mem_used_total + self.stats.table_bytes) as f64 / m.orig_data_size.max(1) as f64
        );
    }

    /// Idle recompression's and writeback's figures, when they ran.
    fn slow_path_lines(&self, s: &mut String) {
        if let Some(r) = &self.recompress {
            let _ = writeln!(
                s,
                "\nidle recompression: mem_used_total {} -> {} ({:.3}x, of which the pass's own compaction freed {}), compr {} -> {}; {} of {} pages recompressed, {} incompressible; {:.0} pages/s",
                format_size(r.mem_used_total_primary),
                format_size(r.mem_used_total_after),
                r.mem_used_total_after as f64 / r.mem_used_total_primary.max(1) as f64,
                format_size(r.stats.pages_compacted * PAGE_SIZE as u64),
                format_size(r.compr_primary),
                format_size(r.compr_after),
                r.stats.recompressed,
                r.stats.candidates,
                r.stats.incompressible,
                r.stats.candidates as f64 / r.seconds.max(1e-9)
            );
            match &r.groups {
                Some(g) if g.stats.groups > 0 => {
                    let _ = writeln!(
                        s,
                        "cold groups: {} of the idle pages in {} groups of {MIN_GROUP_PAGES} to {} neighbours; mem_used_total {} -> {} ({:.3}x), compr {} -> {} ({:.3}x of page by page); {:.0} pages/s",
                        g.stats.grouped_pages,
                        g.stats.groups,
                        g.max_pages,
                        format_size(r.mem_used_total_after),
                        format_size(g.mem_used_total_after),
                        g.mem_used_total_after as f64 / r.mem_used_total_after.max(1) as f64,
                        format_size(r.compr_after),
                        format_size(g.compr_after),
                        g.compr_after as f64 / r.compr_after.max(1) as f64,
                        g.stats.grouped_pages as f64 / g.seconds.max(1e-9)
                    );
                }
                Some(_) => {
                    let _ = writeln!(
                        s,
                        "cold groups: no run of {MIN_GROUP_PAGES} or more idle neighbours stores less grouped"
                    );
                }
                None => {}
            }
        }
        if let Some(w) = &self.writeback {
            let _ = writeln!(
                s,
                "writeback: {} pages, {} written ({:.3}x of raw 4 KiB writeback's {}), {:.0} pages/s; mem_used_total after {}",
                w.pages,
                format_size(w.bytes_written),
                w.bytes_written as f64 / w.bytes_raw_equivalent.max(1) as f64,
                format_size(w.bytes_raw_equivalent),
                w.pages as f64 / w.seconds.max(1e-9),
                format_size(w.mem_used_total_after)
            );
        }
    }
}
