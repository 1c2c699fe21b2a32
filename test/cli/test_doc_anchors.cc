// Every place the code and the docs cite ("docs/design.md#supervisor" in a comment, a Markdown
// link "[...](design.md#losses)") names a heading that exists, with GitHub's anchors: the
// heading's text in lower case, without punctuation but hyphens and underscores, spaces made
// hyphens, a repeated heading suffixed -1, -2. A comment that wraps inside an anchor ("#in-place-"
// then "// recovery") is read joined.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kSource = DTRAIN_SOURCE_DIR;

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::set<std::string> anchors_of(const fs::path& markdown) {
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  std::istringstream lines(read(markdown));
  std::string line;
  bool fenced = false;
  while (std::getline(lines, line)) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced || line.empty() || line[0] != '#') continue;
    size_t text = line.find_first_not_of('#');
    if (text == std::string::npos || line[text] != ' ') continue;
    std::string anchor;
    for (char c : line.substr(text + 1)) {
      const auto u = static_cast<unsigned char>(c);
      if (std::isalnum(u) || c == '-' || c == '_' || u >= 0x80) {
        anchor += static_cast<char>(std::tolower(u));
      } else if (c == ' ') {
        anchor += '-';
      }
    }
    while (!anchor.empty() && anchor.back() == '-') anchor.pop_back();  // trailing spaces
    const int n = seen[anchor]++;
    anchors.insert(n == 0 ? anchor : anchor + "-" + std::to_string(n));
  }
  return anchors;
}

bool cited_kind(const fs::path& path) {
  static const std::set<std::string> kinds = {".h",  ".cc",    ".cu", ".cuh", ".sh",
                                              ".py", ".cmake", ".md", ".txt"};
  return kinds.count(path.extension().string()) != 0;
}

}  // namespace

TEST_CASE("every docs anchor the code and the docs cite exists") {
  std::map<fs::path, std::set<std::string>> anchors;
  auto exists = [&](const fs::path& markdown, const std::string& anchor) {
    if (!anchors.count(markdown)) anchors[markdown] = anchors_of(markdown);
    return anchors[markdown].count(anchor) != 0;
  };
  // A comment wrapped inside a cited anchor: the rest continues after the comment marker.
  const std::regex wrapped(R"(-\n[ \t]*(//+|#+|///)[ \t]*)");
  const std::regex code_cite(R"(docs/([a-z0-9_-]+\.md)#([A-Za-z0-9_-]+))");
  const std::regex markdown_link(R"(\]\(([^)#\s]*)#([^)\s]+)\))");
  std::vector<fs::path> files = {kSource / "README.md"};
  for (const char* dir :
       {"common", "launcher", "worker", "test", "scripts", "bench", "examples", "cmake", "docs"}) {
    for (const auto& entry : fs::recursive_directory_iterator(kSource / dir))
      if (entry.is_regular_file() && cited_kind(entry.path())) files.push_back(entry.path());
  }
  int cited = 0;
  for (const fs::path& file : files) {
    const std::string text = std::regex_replace(read(file), wrapped, "-");
    for (auto m = std::sregex_iterator(text.begin(), text.end(), code_cite);
         m != std::sregex_iterator(); ++m) {
      const fs::path markdown = kSource / "docs" / (*m)[1].str();
      INFO(fs::relative(file, kSource).string() << " cites " << (*m)[0].str());
      CHECK(fs::exists(markdown));
      if (fs::exists(markdown)) CHECK(exists(markdown, (*m)[2].str()));
      ++cited;
    }
    if (file.extension() != ".md") continue;
    for (auto m = std::sregex_iterator(text.begin(), text.end(), markdown_link);
         m != std::sregex_iterator(); ++m) {
      const std::string target = (*m)[1].str();
      const fs::path markdown = target.empty() ? file : file.parent_path() / target;
      if (markdown.extension() != ".md") continue;
      INFO(fs::relative(file, kSource).string() << " links " << (*m)[0].str());
      CHECK(fs::exists(markdown));
      if (fs::exists(markdown)) CHECK(exists(fs::weakly_canonical(markdown), (*m)[2].str()));
      ++cited;
    }
  }
  CHECK(cited > 100);  // the walk found the sources
}
