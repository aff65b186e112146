"""podbay.store"""
