// Node workload for the JIT benchmarks (scripts/bench/bench_node.sh): Maps of Buffers,
// a rolling window of 64 KiB Buffers and strings, hashed at the end. Node allocates the
// backing stores of Buffers with malloc (its ArrayBuffer allocator), from JIT-compiled
// JavaScript. Prints a digest that must not change under a profiler.
'use strict';
const crypto = require('crypto');
const scale = Number(process.argv[2] || 1);

function fillMaps(rounds) {
    const maps = [];
    for (let r = 0; r < rounds; r++) {
        const m = new Map();
        for (let i = 0; i < 2000; i++)
            m.set('k' + i, Buffer.alloc(64 + ((i * 37 + r) % 900), i & 0xff));
        maps.push(m);
        if (maps.length > 8)
            maps.shift();
    }
    return maps;
}

function rollingWindow(n) {
    const win = [];
    const h = crypto.createHash('sha256');
    for (let i = 0; i < n; i++) {
        const b = Buffer.allocUnsafe(65536);
        b.fill(i & 0xff);
        win.push(b);
        if (win.length > 32)
            h.update(win.shift().subarray(0, 64));
    }
    return h.digest('hex');
}

const maps = fillMaps(Math.round(60 * scale));
const digest = rollingWindow(Math.round(3000 * scale));
let total = 0;
for (const m of maps)
    for (const v of m.values())
        total += v.length;
console.log(total, digest);
