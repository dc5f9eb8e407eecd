"""``--lookup``: llama.cpp's n-gram rule over context, dynamic and static caches, and their files."""
