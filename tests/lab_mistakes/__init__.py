"""Mistakes learners make in the labs, each planted in one function (``tests/test_labs.py``).

Each file is a lab answer with one mistake, marked ``# the mistake``; the lab's other
functions are the reference's own. ``tests/test_labs.py`` runs the lab with each file
(``--lab-source``) and checks that it fails with a message a learner can act on: the
invariant in words, the numbers that disagree, the smallest example.
"""
