//! The engine as a library: no ublk, no root, no kernel module. Makes a 16 MiB zstd device,
//! writes a text page, a zero page and a page of noise, reads them back, discards one and prints
//! zram's `mm_stat` and `io_stat` lines with the table's own cost.
//!
//! Run with `cargo run -p uzram-engine --example embed`.

#![deny(unsafe_code)]

use uzram_engine::testing::pages::noise_page;
use uzram_engine::{
    format_size, parse_size, Device, DeviceSetup, Error, PageIndex, SlotFlags, PAGE_SIZE,
};

fn main() -> Result<(), Error> {
    let mut setup = DeviceSetup::new();
    setup.set_comp_algorithm("zstd")?;
    setup.set_algorithm_params("level=3")?;
    let device = setup.init(parse_size("16M")?)?;
    let mut ctx = device.context()?; // one per I/O thread

    let text: Vec<u8> = b"uzram keeps swapped-out pages compressed in RAM. "
        .iter()
        .copied()
        .cycle()
        .take(PAGE_SIZE)
        .collect();
    let pages: [(&str, Vec<u8>); 3] = [
        ("text", text),
        ("zeros", vec![0; PAGE_SIZE]),
        ("noise", noise_page(7).to_vec()),
    ];
    for (i, (_, page)) in pages.iter().enumerate() {
        device.write(&mut ctx, offset(i), page)?;
    }

    let mut back = vec![0; PAGE_SIZE];
    for (i, (name, page)) in pages.iter().enumerate() {
        device.read(&mut ctx, offset(i), &mut back)?;
        assert!(back == *page, "the {name} page came back different");
        let slot = device
            .slot_state(PageIndex(i as u64))
            .expect("page on the device");
        let how = if slot.flags.contains(SlotFlags::SAME) {
            "same-filled: kept in its slot"
        } else if slot.flags.contains(SlotFlags::HUGE) {
            "huge: stored raw"
        } else {
            "compressed"
        };
        println!(
            "page {i} ({name:>5}): {:>4} bytes in the pool, {how}",
            slot.size
        );
    }

    print_stats("after three writes", &device);
    // How swap frees a slot: the page is dropped and reads as zeros again.
    device.discard(offset(0), PAGE_SIZE as u64)?;
    device.read(&mut ctx, offset(0), &mut back)?;
    assert!(
        back.iter().all(|&b| b == 0),
        "a discarded page reads as zeros"
    );
    print_stats("after discarding the text page", &device);
    Ok(())
}

fn offset(page: usize) -> u64 {
    (page * PAGE_SIZE) as u64
}

/// Bytes that do not compress (xorshift64).
fn print_stats(when: &str, device: &Device) {
    let s = device.stats();
    println!("\n{when}:");
    println!("  mm_stat: {}", device.mm_stat().trim_end());
    println!("  io_stat: {}", device.io_stat().trim_end());
    println!(
        "  {} of data in {} of pool pages; table and metadata {}",
        format_size(s.mm.orig_data_size),
        format_size(s.mm.mem_used_total),
        format_size(s.table_bytes)
    );
}
