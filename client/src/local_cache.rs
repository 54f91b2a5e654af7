//! The bounded local-only cache a client uses while no master is reachable:
//! least-recently-used eviction under a byte budget. Pure (no I/O).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub struct LocalCache {
    budget: u64,
    used: u64,
    tick: u64,
    entries: HashMap<String, (Arc<Vec<u8>>, u64)>,
    by_age: BTreeMap<u64, String>,
}

impl LocalCache {
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            used: 0,
            tick: 0,
            entries: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Inserts, evicting least-recently-used entries to stay in budget.
    /// Returns the evicted keys; a value larger than the budget is refused (`Err`).
    pub fn insert(&mut self, key: &str, value: Arc<Vec<u8>>) -> Result<Vec<String>, u64> {
        let size = value.len() as u64;
        if size > self.budget {
            return Err(size);
        }
        self.remove(key);
        let mut evicted = Vec::new();
        while self.used + size > self.budget {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            if let Some((v, _)) = self.entries.remove(&oldest) {
                self.used -= v.len() as u64;
            }
            evicted.push(oldest);
        }
        self.tick += 1;
        self.by_age.insert(self.tick, key.to_string());
        self.entries.insert(key.to_string(), (value, self.tick));
        self.used += size;
        Ok(evicted)
    }

    pub fn get(&mut self, key: &str) -> Option<Arc<Vec<u8>>> {
        let (value, age) = self.entries.get_mut(key)?;
        self.by_age.remove(age);
        self.tick += 1;
        *age = self.tick;
        self.by_age.insert(self.tick, key.to_string());
        Some(value.clone())
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    pub fn remove(&mut self, key: &str) -> Option<Arc<Vec<u8>>> {
        let (v, age) = self.entries.remove(key)?;
        self.by_age.remove(&age);
        self.used -= v.len() as u64;
        Some(v)
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.by_age.clear();
        self.used = 0;
    }

    pub fn keys(&self) -> Vec<String> {
        self.by_age.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: usize) -> Arc<Vec<u8>> {
        Arc::new(vec![1; n])
    }

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let mut c = LocalCache::new(100);
        c.insert("a", v(40)).unwrap();
        c.insert("b", v(40)).unwrap();
        assert!(c.get("a").is_some()); // a is now newer than b
        let evicted = c.insert("c", v(40)).unwrap();
        assert_eq!(evicted, vec!["b".to_string()]);
        assert!(c.contains("a") && c.contains("c") && !c.contains("b"));
        assert_eq!(c.used(), 80);
        assert_eq!(c.insert("huge", v(101)), Err(101));
        c.insert("a", v(10)).unwrap();
        assert_eq!(c.used(), 50);
        assert_eq!(c.remove("c").map(|x| x.len()), Some(40));
        assert_eq!(c.keys(), vec!["a".to_string()]);
    }
}
