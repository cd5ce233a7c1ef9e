"""Three texts of different kinds (prose, code, science) for accuracy checks: teacher-forced
over them, a model's next-token distributions show errors across kinds of tokens."""

TEXTS = [
    "The quick brown fox jumps over the lazy dog. Meanwhile, in a small village by the sea, "
    "the fishermen were preparing their boats for the long night ahead, checking nets and "
    "singing old songs while the children ran along the harbour wall.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\nfor i in range(10):\n    print(i, fibonacci(i))\n",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon "
    "dioxide to make glucose and oxygen. It happens mostly in the leaves, inside chloroplasts, "
    "where chlorophyll absorbs red and blue light and reflects green light back to our eyes.",
]
