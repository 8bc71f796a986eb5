// The Laplacian generator: graph definitions, CSR assembly and the plain-loop oracle.
#include "spmv/laplacian.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "runtime/error.h"

namespace tb::laplacian {

namespace {

constexpr int min_k = 4, max_k = 8;
// Below this many nodes, counts are taken from the graph itself rather than a closed form.
constexpr int64_t small_graph = 4096;

int64_t grid_nx(int64_t n) { return std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(n)))); }
int64_t grid3d_nx(int64_t n) { return std::max<int64_t>(1, std::llround(std::cbrt(static_cast<double>(n)))); }

// Edges along lines of length nx (the last line partial).
int64_t line_edges(int64_t n, int64_t nx) { return (n / nx) * (nx - 1) + std::max<int64_t>(n % nx - 1, 0); }

// Fisher-Yates from (seed, stream): the same permutation on every machine.
std::vector<int32_t> permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int32_t> order(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  for (int64_t j = n - 1; j > 0; --j) {
    const uint64_t r = splitmix64(seed * 0x9e3779b97f4a7c15ull ^ (stream << 40) ^ static_cast<uint64_t>(j));
    std::swap(order[j], order[r % static_cast<uint64_t>(j + 1)]);
  }
  return order;
}

}  // namespace

std::string GraphSpec::name() const {
  switch (family) {
    case Family::ring:
      return "ring" + std::to_string(k);
    case Family::random:
      return "random" + std::to_string(k);
    case Family::grid2d:
      return "grid2d";
    case Family::grid3d:
      return "grid3d";
  }
  return "";
}

std::vector<std::string> graph_names() {
  std::vector<std::string> names;
  for (const char* family : {"ring", "random"})
    for (int k = min_k; k <= max_k; ++k) names.push_back(family + std::to_string(k));
  names.push_back("grid2d");
  names.push_back("grid3d");
  return names;
}

GraphSpec parse_graph(const std::string& name) {
  if (name == "grid2d") return GraphSpec{Family::grid2d, 4};
  if (name == "grid3d") return GraphSpec{Family::grid3d, 6};
  for (const auto& [prefix, family] : {std::pair<const char*, Family>{"ring", Family::ring}, {"random", Family::random}}) {
    const std::string p = prefix;
    if (name.size() == p.size() + 1 && name.compare(0, p.size(), p) == 0) {
      const int k = name.back() - '0';
      if (k >= min_k && k <= max_k) return GraphSpec{family, k};
    }
  }
  std::string all;
  for (const auto& g : graph_names()) all += (all.empty() ? "" : ", ") + g;
  throw UsageError("unknown graph '" + name + "' (" + all + ")");
}

int64_t nnz(const GraphSpec& spec, int64_t n) {
  const bool small = n < small_graph || (spec.family == Family::ring && n < spec.k + 3);
  if (small) {
    const Graph g(spec, n);
    std::vector<int32_t> nb;
    int64_t count = n;
    for (int64_t i = 0; i < n; ++i) {
      g.neighbours(i, nb);
      count += static_cast<int64_t>(nb.size());
    }
    return count;
  }
  switch (spec.family) {
    case Family::ring:
      return n * (1 + 2 * (spec.k / 2)) + (spec.k % 2 ? 2 * (n / 2) : 0);
    case Family::random:
      return n * (spec.k + 1);
    case Family::grid2d: {
      const int64_t nx = grid_nx(n);
      return n + 2 * (line_edges(n, nx) + std::max<int64_t>(n - nx, 0));
    }
    case Family::grid3d: {
      const int64_t nx = grid3d_nx(n), ny = nx, lines = (n + nx - 1) / nx;
      int64_t y_edges = 0;  // between line l and l + 1 of the same plane: as many as line l + 1 holds
      for (int64_t l = 0; l + 1 < lines; ++l)
        if (l % ny != ny - 1) y_edges += std::min(nx, n - (l + 1) * nx);
      return n + 2 * (line_edges(n, nx) + y_edges + std::max<int64_t>(n - nx * ny, 0));
    }
  }
  return 0;
}

std::string csr_unsupported(const GraphSpec& spec, int64_t n) {
  if (n > INT32_MAX || static_cast<double>(n) * (spec.k + 1) > static_cast<double>(INT32_MAX))
    return "rows=" + std::to_string(n) + " with " + std::to_string(spec.k) +
           " neighbours overflows 32-bit CSR indices (at most 2^31 - 1 nonzeros)";
  return "";
}

std::string stencil_unsupported(const GraphSpec& spec, int64_t n) {
  if (spec.family == Family::random) return "a random graph has no stencil: its neighbours exist only as an adjacency list";
  if (spec.family == Family::ring && n < spec.k + 3)
    return "a ring stencil with k=" + std::to_string(spec.k) + " needs at least " + std::to_string(spec.k + 3) +
           " rows (fewer, and its offsets meet)";
  return "";
}

Graph::Graph(GraphSpec spec, int64_t n, uint64_t seed) : spec_(spec), n_(n) {
  TB_REQUIRE(n >= 1 && n <= INT32_MAX, "a graph needs 1 to 2^31 - 1 nodes, not " + std::to_string(n));
  if (spec.family == Family::grid2d) nx_ = grid_nx(n);
  if (spec.family == Family::grid3d) nx_ = ny_ = grid3d_nx(n);
  if (spec.family == Family::random) {
    const int orders = spec.k / 2 + spec.k % 2;  // the cycles, then the matching for odd k
    for (int c = 0; c < orders; ++c) {
      order_.push_back(permutation(n, seed, static_cast<uint64_t>(c)));
      std::vector<int32_t> pos(static_cast<std::size_t>(n));
      for (int64_t j = 0; j < n; ++j) pos[order_.back()[j]] = static_cast<int32_t>(j);
      position_.push_back(std::move(pos));
    }
  }
}

void Graph::neighbours(int64_t i, std::vector<int32_t>& out) const {
  out.clear();
  const int64_t n = n_;
  auto add = [&](int64_t j) {
    if (j != i) out.push_back(static_cast<int32_t>(j));
  };
  switch (spec_.family) {
    case Family::ring: {
      for (int64_t d = 1; d <= spec_.k / 2; ++d) {
        add((i + d) % n);
        add(((i - d) % n + n) % n);
      }
      const int64_t m = n / 2;
      if (spec_.k % 2 && m > 0) {
        if (i < m) add(i + m);
        else if (i < 2 * m) add(i - m);
      }
      break;
    }
    case Family::random: {
      const int cycles = spec_.k / 2;
      for (int c = 0; c < cycles; ++c) {
        const int64_t p = position_[c][i];
        add(order_[c][(p + 1) % n]);
        add(order_[c][(p + n - 1) % n]);
      }
      if (spec_.k % 2) {
        const int64_t partner = position_[cycles][i] ^ 1;
        if (partner < n) add(order_[cycles][partner]);
      }
      break;
    }
    case Family::grid2d: {
      const int64_t x = i % nx_;
      if (x > 0) add(i - 1);
      if (x < nx_ - 1 && i + 1 < n) add(i + 1);
      if (i - nx_ >= 0) add(i - nx_);
      if (i + nx_ < n) add(i + nx_);
      break;
    }
    case Family::grid3d: {
      const int64_t x = i % nx_, y = (i / nx_) % ny_, plane = nx_ * ny_;
      if (x > 0) add(i - 1);
      if (x < nx_ - 1 && i + 1 < n) add(i + 1);
      if (y > 0) add(i - nx_);
      if (y < ny_ - 1 && i + nx_ < n) add(i + nx_);
      if (i - plane >= 0) add(i - plane);
      if (i + plane < n) add(i + plane);
      break;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

Stencil Graph::stencil(double alpha) const {
  TB_REQUIRE(stencil_unsupported(spec_, n_).empty(), stencil_unsupported(spec_, n_));
  Stencil s;
  s.family = spec_.family;
  s.n = n_;
  s.alpha = alpha;
  s.half = spec_.family == Family::ring ? spec_.k / 2 : 0;
  s.opposite = spec_.family == Family::ring && spec_.k % 2 ? n_ / 2 : 0;
  s.nx = nx_;
  s.ny = ny_;
  return s;
}

Csr build_shifted_laplacian(const Graph& graph, double alpha) {
  const int64_t n = graph.rows();
  Csr a;
  a.n = n;
  a.row_ptr = HostBuffer<int32_t>(static_cast<std::size_t>(n + 1));
  std::vector<int64_t> counts(static_cast<std::size_t>(n));
#pragma omp parallel
  {
    std::vector<int32_t> nb;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      graph.neighbours(i, nb);
      counts[i] = static_cast<int64_t>(nb.size()) + 1;
    }
  }
  int64_t total = 0;
  a.row_ptr[0] = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += counts[i];
    TB_REQUIRE(total <= INT32_MAX, "the matrix has more than 2^31 - 1 nonzeros");
    a.row_ptr[i + 1] = static_cast<int32_t>(total);
  }
  a.nnz = total;
  a.col = HostBuffer<int32_t>(static_cast<std::size_t>(total));
  a.val = HostBuffer<double>(static_cast<std::size_t>(total));
  int32_t* col = a.col.data();
  double* val = a.val.data();
  const int32_t* row_ptr = a.row_ptr.data();
#pragma omp parallel
  {
    std::vector<int32_t> nb;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      graph.neighbours(i, nb);
      int64_t at = row_ptr[i];
      bool diagonal_done = false;
      for (const int32_t j : nb) {
        if (!diagonal_done && j > i) {
          col[at] = static_cast<int32_t>(i);
          val[at++] = 1.0 + alpha * static_cast<double>(nb.size());
          diagonal_done = true;
        }
        col[at] = j;
        val[at++] = -alpha;
      }
      if (!diagonal_done) {
        col[at] = static_cast<int32_t>(i);
        val[at] = 1.0 + alpha * static_cast<double>(nb.size());
      }
    }
  }
  return a;
}

void reference_apply(const Graph& graph, double alpha, const double* x, double* y, double* scale) {
  const int64_t n = graph.rows();
#pragma omp parallel
  {
    std::vector<int32_t> nb;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      graph.neighbours(i, nb);
      const double diagonal = 1.0 + alpha * static_cast<double>(nb.size());
      double sum = 0, magnitude = 0;
      for (const int32_t j : nb) {
        sum += x[j];
        magnitude += std::abs(x[j]);
      }
      y[i] = diagonal * x[i] - alpha * sum;
      if (scale) scale[i] = diagonal * std::abs(x[i]) + alpha * magnitude;
    }
  }
}

std::vector<double> dense_shifted_laplacian(const Graph& graph, double alpha) {
  const int64_t n = graph.rows();
  TB_REQUIRE(n <= small_graph, "a dense matrix is for small graphs only");
  std::vector<double> a(static_cast<std::size_t>(n * n), 0.0);
  std::vector<int32_t> nb;
  for (int64_t i = 0; i < n; ++i) {
    graph.neighbours(i, nb);
    for (const int32_t j : nb) {
      a[i * n + j] -= alpha;
      a[i * n + i] += alpha;
    }
    a[i * n + i] += 1.0;
  }
  return a;
}

}  // namespace tb::laplacian
