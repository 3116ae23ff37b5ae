// A node program with a known JavaScript leak, for tests/e2e/test_jit.c: heapprofJsLeak()
// keeps 8 MiB of Buffers alive (node allocates their backing stores with malloc), while
// churn() allocates and drops as many. Run with --perf-basic-prof so that the profiler
// can name the JIT-compiled functions. Prints a line that must not change under it.
'use strict';
const kept = [];

function heapprofJsLeak(n)
{
    for (let i = 0; i < n; i++)
        kept.push(Buffer.alloc(4096, i & 0xff));
}

function churn(n)
{
    let sum = 0;
    for (let i = 0; i < n; i++)
        sum += Buffer.alloc(4096, 1)[i & 4095];
    return sum;
}

let sum = 0;
for (let round = 0; round < 64; round++) {
    heapprofJsLeak(32);
    sum += churn(2048);
}
let bytes = 0;
for (const b of kept)
    bytes += b.length;
console.log('kept', kept.length, 'bytes', bytes, 'churned', sum);
// Leave without tearing the environment down (a normal end frees every Buffer's memory
// first): the leak is still held when the profile is taken at exit.
process.exit(0);
