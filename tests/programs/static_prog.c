/* tests/programs/static_prog.c: a statically linked program heapprof must refuse. With
 * "wait", it waits for EOF on stdin before it ends (a running target to attach). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    puts("static");
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char buf[64];
        while (read(0, buf, sizeof(buf)) > 0)
            ;
    }
    return 0;
}
