"""The learner's labs: one file per step, the functions that carry its idea, to be written.

``make lab STEP=NN`` runs step NN's own tests with ``labs/stepNN.py``'s functions in place
of the reference ones (see ``tests/labs.py``). The site's *Labs* page says what each lab asks.
"""
