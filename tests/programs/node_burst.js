// A node program that allocates hard from its first moment, for tests/e2e/test_jit.c:
// 20,000 Buffers of 4 to 7 KiB, 256 kept at a time. Records arrive while the service
// would read node's 90 MB binary for the first stacks; a service that read it only then
// let the client's ring fill and its wait for room run out. Prints a line that must not
// change under the profiler.
'use strict';
const keep = [];
let sum = 0;
for (let i = 0; i < 20000; i++) {
    const b = Buffer.alloc(4096 + (i % 7) * 512, i & 0xff);
    sum += b[i % b.length];
    keep.push(b);
    if (keep.length > 256)
        keep.shift();
}
console.log('kept', keep.length, 'sum', sum);
