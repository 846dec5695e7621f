// "Did you mean": the known word nearest a mistyped one (a flag, a config
// key), by edit distance.
#ifndef SHOAL_CORE_NEAREST_WORD_H_
#define SHOAL_CORE_NEAREST_WORD_H_

#include <set>
#include <string>

namespace shoal {

// The word of `known` fewest single-character edits (insert, delete,
// replace, swap of neighbours) from `word`, if it is close enough to be a
// typo of it (at most 2 edits, or a third of its length); else "".
std::string NearestWord(const std::string& word, const std::set<std::string>& known);

// " (did you mean PREFIX+X?)" for NearestWord's X (prefix "--" for a
// flag); "" when none is near.
std::string DidYouMean(const std::string& word, const std::set<std::string>& known, const std::string& prefix = "");

}  // namespace shoal

#endif  // SHOAL_CORE_NEAREST_WORD_H_
