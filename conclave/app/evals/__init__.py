"""`conclave eval`: does the council beat its best member, at equal cost, on your questions?
(docs/eval.md)"""
