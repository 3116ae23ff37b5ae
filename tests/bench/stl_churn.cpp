/* tests/bench/stl_churn.cpp: an STL-heavy C++ program for the overhead benchmark
 * (scripts/bench/bench_overhead.sh).
 *
 *     stl_churn [ROUNDS]
 *
 * Each round builds a word list (std::string, most beyond the small-string buffer), an
 * index std::map<std::string, std::vector<int>>, a std::unordered_map of counts and a
 * sorted, deduplicated copy, then erases half the index; everything is freed at the end
 * of the round. Prints a checksum so the work is not elided.
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace
{

constexpr int WORDS = 20000;

struct xorshift {
    uint64_t x;
    uint64_t next()
    {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        return x;
    }
};

std::string make_word(xorshift &rng)
{
    static const char letters[] = "abcdefghijklmnopqrstuvwxyz";
    size_t len = 4 + rng.next() % 40;
    std::string w;
    for (size_t i = 0; i < len; i++)
        w += letters[rng.next() % 26];
    return w;
}

uint64_t round_once(xorshift &rng)
{
    std::vector<std::string> words;
    for (int i = 0; i < WORDS; i++)
        words.push_back(make_word(rng) + "/" + std::to_string(rng.next() % 1000));

    std::map<std::string, std::vector<int>> index;
    std::unordered_map<std::string, int> counts;
    for (int i = 0; i < WORDS; i++) {
        const std::string &w = words[i];
        index[w.substr(0, 3)].push_back(i);
        counts[w]++;
    }

    std::vector<std::string> sorted(words);
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());

    uint64_t sum = sorted.size() + counts.size();
    int n = 0;
    for (auto it = index.begin(); it != index.end(); n++) {
        sum += it->second.size();
        if (n % 2)
            it = index.erase(it);
        else
            ++it;
    }
    return sum + index.size();
}

} // namespace

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? std::atol(argv[1]) : 20;
    xorshift rng{0x9e3779b97f4a7c15ull};
    uint64_t sum = 0;
    for (long r = 0; r < rounds; r++)
        sum += round_once(rng);
    std::printf("checksum %llu\n", static_cast<unsigned long long>(sum));
    return 0;
}
