/* tests/cli/test_output.c: opening the trace file (cli/output.c) where other users may
 * have prepared the name: planted symlinks and hard links, files of others, made-up
 * names taken already. Cases that need another user's files (lchown, chown) run as root
 * only. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

#define OTHER_UID 65534

static char g_dir[64];

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *get(const char *path)
{
    static char buf[256];
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void in_dir(char *buf, const char *name)
{
    snprintf(buf, PATH_MAX, "%s/%s", g_dir, name);
    (void)unlink(buf);
}

static int open_out(const char *path, bool made_up, char *opened, char *err)
{
    return cli_output_open(path, made_up, opened, PATH_MAX, err, 512);
}

/* A new name: created; a regular file of ours: overwritten in place (what a user who
 * names it expects). */
static void test_output_new_and_own_file(void **state)
{
    (void)state;
    char path[PATH_MAX], opened[PATH_MAX], err[512];
    in_dir(path, "new.pftrace");
    int fd = open_out(path, false, opened, err);
    assert_true(fd >= 0);
    assert_string_equal(opened, path);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_mode & 0133, 0); /* at most 0644 */
    close(fd);

    put(path, "an older trace");
    struct stat before;
    assert_int_equal(stat(path, &before), 0);
    fd = open_out(path, false, opened, err);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_ino, before.st_ino);
    assert_int_equal(st.st_size, 0);
    close(fd);
}

/* A hard link to a file (ours, but also reachable under another name): not truncated. */
static void test_output_hard_link_refused(void **state)
{
    (void)state;
    char victim[PATH_MAX], path[PATH_MAX], opened[PATH_MAX], err[512];
    in_dir(victim, "victim-hl");
    in_dir(path, "out-hl.pftrace");
    put(victim, "precious");
    assert_int_equal(link(victim, path), 0);
    assert_int_equal(open_out(path, false, opened, err), -EPERM);
    assert_non_null(strstr(err, "hard links"));
    assert_string_equal(get(victim), "precious");
}

/* A symlink of ours to /dev/null (like /dev/stdout to a pipe): written to, as it is. */
static void test_output_own_symlink_to_device(void **state)
{
    (void)state;
    char path[PATH_MAX], opened[PATH_MAX], err[512];
    in_dir(path, "null.pftrace");
    assert_int_equal(symlink("/dev/null", path), 0);
    int fd = open_out(path, false, opened, err);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "x", 1), 1);
    close(fd);
}

/* A symlink planted by another user in a shared directory, to a file of ours: the old
 * open (O_CREAT | O_TRUNC) followed it and truncated the file, as root any file. */
static void test_output_bug_planted_symlink_truncates_target(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* lchown to another uid */
    char victim[PATH_MAX], path[PATH_MAX], opened[PATH_MAX], err[512];
    in_dir(victim, "victim-sl");
    in_dir(path, "out-sl.pftrace");
    put(victim, "precious");
    assert_int_equal(symlink(victim, path), 0);
    assert_int_equal(lchown(path, OTHER_UID, OTHER_UID), 0);
    assert_int_equal(open_out(path, false, opened, err), -EPERM);
    assert_non_null(strstr(err, "symbolic link owned by uid 65534"));
    assert_string_equal(get(victim), "precious");
    /* A made-up name takes the next free one instead. */
    int fd = open_out(path, true, opened, err);
    assert_true(fd >= 0);
    close(fd);
    char want[PATH_MAX];
    snprintf(want, sizeof(want), "%s/out-sl.1.pftrace", g_dir);
    assert_string_equal(opened, want);
    assert_string_equal(get(victim), "precious");
    unlink(want);
}

/* A file of another user at the name: not ours to truncate, not even as root. */
static void test_output_other_users_file_refused(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    char path[PATH_MAX], opened[PATH_MAX], err[512];
    in_dir(path, "theirs.pftrace");
    put(path, "their data");
    assert_int_equal(chown(path, OTHER_UID, OTHER_UID), 0);
    assert_int_equal(open_out(path, false, opened, err), -EPERM);
    assert_non_null(strstr(err, "belongs to uid 65534"));
    assert_string_equal(get(path), "their data");
}

/* Made-up names never reuse a file: the next number is taken, up to 99. */
static void test_output_made_up_name_numbered(void **state)
{
    (void)state;
    char path[PATH_MAX], one[PATH_MAX], opened[PATH_MAX], err[512];
    in_dir(path, "heapprof-x-42.pftrace");
    in_dir(one, "heapprof-x-42.1.pftrace");
    put(path, "older");
    int fd = open_out(path, true, opened, err);
    assert_true(fd >= 0);
    assert_string_equal(opened, one);
    close(fd);
    assert_string_equal(get(path), "older");
    unlink(one);
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/heapprof-output-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    /* Shared like /tmp: anyone may create names, the sticky bit keeps them theirs. */
    return chmod(g_dir, 01777);
}

static int group_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_output_new_and_own_file),
        cmocka_unit_test(test_output_hard_link_refused),
        cmocka_unit_test(test_output_own_symlink_to_device),
        cmocka_unit_test(test_output_bug_planted_symlink_truncates_target),
        cmocka_unit_test(test_output_other_users_file_refused),
        cmocka_unit_test(test_output_made_up_name_numbered),
    };
    return cmocka_run_group_tests_name("cli_output", tests, group_setup, group_teardown);
}
