// Private: emits pickle protocol 2 opcodes, the subset torch's weights-only unpickler accepts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashinfer::formats {

class PickleWriter {
 public:
  PickleWriter();                                // PROTO 2
  void mark() { op('('); }                       // MARK
  void empty_dict() { op('}'); }                 // EMPTY_DICT
  void empty_tuple() { op(')'); }                // EMPTY_TUPLE
  void tuple() { op('t'); }                      // TUPLE (from MARK)
  void reduce() { op('R'); }                     // REDUCE
  void setitems() { op('u'); }                   // SETITEMS (from MARK)
  void binpersid() { op('Q'); }                  // BINPERSID
  void boolean(bool v) { op(v ? 0x88 : 0x89); }  // NEWTRUE / NEWFALSE
  void none() { op('N'); }
  void global(std::string_view module, std::string_view name);  // GLOBAL
  void unicode(std::string_view s);                             // BINUNICODE
  void integer(int64_t v);  // BININT1 / BININT2 / BININT / LONG1
  void int_tuple(const std::vector<int64_t>& v);
  /// STOP; returns the finished bytes.
  const std::string& finish();

 private:
  void op(int code) { out_.push_back(static_cast<char>(code)); }
  std::string out_;
};

}  // namespace flashinfer::formats
