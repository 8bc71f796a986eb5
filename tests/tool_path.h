// Where the command-line tool under test is: beside an installed test binary (<prefix>/tests/ and
// <prefix>/bin/, the layout TRAINBENCH_INSTALL_TESTS gives, copied to a GPU node), else the build
// tree's, whose path is compiled in.
#pragma once

#include <filesystem>
#include <string>

namespace tb::testing {

inline std::string tool_path(const char* name, const char* build_tree_path) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed = exe.parent_path().parent_path() / "bin" / name;
    if (std::filesystem::is_regular_file(installed, ec)) return installed.string();
  }
  return build_tree_path;
}

}  // namespace tb::testing
