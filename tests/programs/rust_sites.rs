// tests/programs/rust_sites.rs: a Rust program (std only) whose allocation sites have
// names that need Rust demangling: a free function, a method of a generic type, a
// closure. Built once with each symbol mangling scheme (tests/e2e/test_rust.c).
use std::collections::HashMap;

#[inline(never)]
fn rust_leaky_vectors(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| vec![i as u8; 4096]).collect()
}

struct Cache<T> {
    map: HashMap<u64, T>,
}

impl<T: Clone> Cache<T> {
    #[inline(never)]
    fn insert_many(&mut self, v: &T, n: u64) {
        for i in 0..n {
            self.map.insert(i, v.clone());
        }
    }
}

fn main() {
    let kept = rust_leaky_vectors(1000);
    let mut cache = Cache { map: HashMap::new() };
    cache.insert_many(&"x".repeat(100), 2000);
    let sum: usize = kept.iter().map(|v| v[0] as usize).sum();
    println!("{} {} {}", kept.len(), cache.map.len(), sum);
}
