// validate_results FILE [--all-passed]: exits 0 when FILE is a trainbench-results/1 document (and,
// with --all-passed, every row that ran passed its reference check), else 1 with the reason.
#include <fstream>
#include <iostream>
#include <string>

#include "results.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: validate_results FILE [--all-passed]\n";
    return 2;
  }
  try {
    std::ifstream in(argv[1]);
    if (!in) throw std::runtime_error("cannot open");
    const tb::Results r = tb::results_from_json(nlohmann::json::parse(in));
    if (r.rows.empty()) throw std::runtime_error("no benchmarks");
    if (argc > 2 && std::string(argv[2]) == "--all-passed")
      for (const auto& row : r.rows)
        if (row.disposition == tb::Disposition::incorrect || row.disposition == tb::Disposition::failed)
          throw std::runtime_error(row.name + " " + tb::to_string(row.disposition) + ": " + row.reason);
    std::cout << argv[1] << ": valid, " << r.rows.size() << " benchmarks, " << r.peaks.size() << " peaks, " << r.pairs.size()
              << " pairs\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << argv[1] << ": invalid: " << e.what() << "\n";
    return 1;
  }
}
