// tests/programs/cpp_sites.cpp: C++ allocation paths (std::vector, std::string, new) with
// known totals, printed as "truth <function> <alloc_bytes> <alloc_count> <free_bytes>
// <free_count>".
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#define NOINLINE __attribute__((noinline))
#define BARRIER() __asm__ volatile("" ::: "memory")

namespace heapprof_test
{

struct Widget {
    char payload[4000];
};

// Heap-allocated and never destroyed, so the widgets and strings stay live at exit.
std::vector<std::unique_ptr<Widget>> &g_widgets = *new std::vector<std::unique_ptr<Widget>>;
std::vector<std::string> &g_strings = *new std::vector<std::string>;

NOINLINE void make_widgets(int n)
{
    for (int i = 0; i < n; i++) {
        g_widgets.emplace_back(new Widget());
        BARRIER();
    }
}

NOINLINE void make_strings(int n)
{
    for (int i = 0; i < n; i++) {
        g_strings.emplace_back(std::string(3000, 'x'));
        BARRIER();
    }
}

NOINLINE std::vector<double> make_vector(size_t n)
{
    std::vector<double> v(n, 1.0);
    BARRIER();
    return v;
}

} // namespace heapprof_test

int main()
{
    using namespace heapprof_test;
    g_widgets.reserve(1000);
    g_strings.reserve(1000);
    make_widgets(1000);
    make_strings(1000);
    double sum = 0;
    for (int i = 0; i < 200; i++) {
        std::vector<double> v = make_vector(1000);
        sum += v[0];
    }
    std::printf("truth make_widgets %zu %d 0 0\n", sizeof(Widget) * 1000, 1000);
    std::printf("truth make_strings %d %d 0 0\n", 3001 * 1000, 1000);
    std::printf("truth make_vector %zu %d %zu %d\n", sizeof(double) * 1000 * 200, 200,
                sizeof(double) * 1000 * 200, 200);
    std::printf("sum %.0f\n", sum);
    return 0;
}
